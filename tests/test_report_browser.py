"""The report in a real browser: headless Chromium opens it from file://, driven over the DevTools protocol.

Checks: it loads with no console errors or exceptions, requests nothing but the file itself, every section is
present and every figure renders with a size. Saves a full-page screenshot (also to /tmp/report_screenshot.png).
Needs Debian's `chromium` (installed by .ci/run) and the `websocket-client` package; skips otherwise.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from marketrl.report import SECTIONS, build_report
from tests.report_fixtures import write_pipeline_outputs

pytestmark = pytest.mark.browser

SCREENSHOT_COPY = Path("/tmp/report_screenshot.png")
STARTUP_TIMEOUT_S = 30.0
LOAD_TIMEOUT_S = 30.0
VIEWPORT_WIDTH = 1280


def _chromium() -> str | None:
    for name in (os.environ.get("MARKETRL_CHROMIUM", ""), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class DevTools:
    """A minimal Chrome DevTools Protocol client over one page target's websocket."""

    def __init__(self, websocket_url: str) -> None:
        import websocket

        self._socket = websocket.create_connection(
            websocket_url, timeout=LOAD_TIMEOUT_S, suppress_origin=True
        )
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Call a method and return its result; events received meanwhile are kept in `events`."""
        self._next_id += 1
        message_id = self._next_id
        self._socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv())
            if message.get("id") == message_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_for(self, event: str, timeout_s: float) -> None:
        """Read messages until `event` arrives."""
        deadline = time.monotonic() + timeout_s
        while not any(e["method"] == event for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {event} within {timeout_s} s")
            message = json.loads(self._socket.recv())
            if "method" in message:
                self.events.append(message)

    def close(self) -> None:
        self._socket.close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[DevTools]:
    executable = _chromium()
    if executable is None:
        pytest.skip(
            "headless Chromium not found (Debian: apt-get install chromium; or set MARKETRL_CHROMIUM)"
        )
    pytest.importorskip("websocket", reason="websocket-client is needed to drive Chromium over DevTools")
    profile = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_path))
    process = subprocess.Popen(
        [
            executable,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-default-apps",
            "--hide-scrollbars",
            "--remote-debugging-port=0",
            "--remote-allow-origins=*",
            f"--window-size={VIEWPORT_WIDTH},900",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = None
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not port_file.is_file() or not port_file.read_text().strip():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Chromium did not start (exit code {process.poll()})")
            time.sleep(0.05)
        port = int(port_file.read_text().splitlines()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            targets = json.load(response)
        page = next(t for t in targets if t.get("type") == "page")
        client = DevTools(page["webSocketDebuggerUrl"])
        yield client
    finally:
        if client is not None:
            client.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_report_in_headless_chromium(browser: DevTools, tmp_path: Path) -> None:
    outputs = write_pipeline_outputs(
        tmp_path / "run",
        models=(
            "dqn",
            "ppo",
            "linear",
        ),  # an agent and a forecaster: the leaderboard and the forecast panel render
        symbols=("SYNTH-ES", "<script>alert(1)</script>"),
        forecast_ic={"linear": 0.2},
    )
    report = tmp_path / "eval_report.html"
    build_report(**outputs.report_kwargs(report))
    url = report.resolve().as_uri()

    for domain in ("Page", "Runtime", "Log", "Network"):
        browser.send(f"{domain}.enable")
    browser.send(
        "Emulation.setDeviceMetricsOverride",
        width=VIEWPORT_WIDTH,
        height=900,
        deviceScaleFactor=1,
        mobile=False,
    )
    browser.send("Page.navigate", url=url)
    browser.wait_for("Page.loadEventFired", LOAD_TIMEOUT_S)

    result = browser.send(
        "Runtime.evaluate",
        returnByValue=True,
        expression="""JSON.stringify({
            sections: Array.from(document.querySelectorAll('main > section[id]')).map(s => s.id),
            figures: Array.from(document.querySelectorAll('svg.figure')).map(f => f.getBoundingClientRect().width),
            leaderboard: document.querySelectorAll('#leaderboard tr[data-leaderboard]').length,
            panels: Array.from(document.querySelectorAll('.forecast-panel svg.figure'))
                .map(f => f.getBoundingClientRect().height),
            scripts: document.scripts.length,
            height: document.documentElement.scrollHeight,
            alerts: document.body.innerText.includes('<script>alert(1)</script>'),
        })""",
    )
    page = json.loads(result["result"]["value"])
    screenshot = browser.send(
        "Page.captureScreenshot",
        format="png",
        captureBeyondViewport=True,
        clip={"x": 0, "y": 0, "width": VIEWPORT_WIDTH, "height": page["height"], "scale": 1},
    )
    image = tmp_path / "report.png"
    image.write_bytes(base64.b64decode(screenshot["data"]))
    shutil.copyfile(image, SCREENSHOT_COPY)

    events = browser.events
    errors = [e["params"] for e in events if e["method"] == "Runtime.exceptionThrown"]
    errors += [
        e["params"]
        for e in events
        if e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] == "error"
    ]
    errors += [
        e["params"]["entry"]
        for e in events
        if e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
    ]
    requests = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]

    assert errors == []
    assert [r for r in requests if r != url and not r.startswith("data:")] == [], (
        "the report requested a resource"
    )
    assert url in requests
    assert page["sections"] == [section_id for section_id, _ in SECTIONS]
    assert page["scripts"] == 0, "the escaped symbol must not become a <script> element"
    assert page["alerts"], "the escaped symbol renders as text"
    assert len(page["figures"]) >= 9 and min(page["figures"]) > 300
    assert page["leaderboard"] == 3 + 5, "three models and five baselines"
    assert len(page["panels"]) == 1 and page["panels"][0] > 100
    assert image.stat().st_size > 50_000
