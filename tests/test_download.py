"""The optional Databento download: request construction, cost refusal, key handling (no network)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from marketrl.data.download import API_KEY_ENV, DownloadError, day_requests, download_days

REQUEST = {
    "dataset": "GLBX.MDP3",
    "schema": "ohlcv-1m",
    "symbols": ["ES.c.0"],
    "stype_in": "continuous",
    "start": "2024-01-02",
    "end": "2024-01-04",
    "max_cost_usd": 1.0,
}
SENTINEL = "db-SENTINELKEY0000000000000000000"


class FakeClient:
    """Records calls; writes a small file for each day as the real client would."""

    def __init__(self, key: str, cost: float) -> None:
        self.key, self.cost, self.calls = key, cost, []
        self.metadata, self.timeseries = self, self

    def get_cost(self, **kwargs):
        self.calls.append(("get_cost", kwargs))
        return self.cost

    def get_range(self, **kwargs):
        self.calls.append(("get_range", kwargs))
        Path(kwargs["path"]).write_bytes(b"dbn")


def outputs(tmp_path: Path) -> list[Path]:
    return [
        tmp_path / "glbx-mdp3-20240102.ohlcv-1m.dbn.zst",
        tmp_path / "glbx-mdp3-20240103.ohlcv-1m.dbn.zst",
    ]


def test_one_request_per_day(tmp_path: Path) -> None:
    requests = day_requests(REQUEST, outputs(tmp_path))
    assert [(r["start"], r["end"]) for r in requests] == [
        ("2024-01-02", "2024-01-03"),
        ("2024-01-03", "2024-01-04"),
    ]
    assert all(r["dataset"] == "GLBX.MDP3" and r["stype_in"] == "continuous" for r in requests)


def test_missing_key_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with pytest.raises(DownloadError, match=API_KEY_ENV):
        download_days(REQUEST, outputs(tmp_path), client_factory=lambda key: FakeClient(key, 0.1))


def test_refuses_above_budget_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, SENTINEL)
    client = FakeClient(SENTINEL, cost=3.5)
    with pytest.raises(DownloadError, match="max_cost_usd"):
        download_days(REQUEST, outputs(tmp_path), client_factory=lambda key: client)
    assert [name for name, _ in client.calls] == ["get_cost"]
    assert list(tmp_path.iterdir()) == []


def test_downloads_each_day_and_never_logs_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys
) -> None:
    monkeypatch.setenv(API_KEY_ENV, SENTINEL)
    client = FakeClient(SENTINEL, cost=0.25)
    with caplog.at_level(logging.DEBUG):
        cost = download_days(REQUEST, outputs(tmp_path), client_factory=lambda key: client)
    assert cost == 0.25 and client.key == SENTINEL
    assert [name for name, _ in client.calls] == ["get_cost", "get_range", "get_range"]
    assert all(path.read_bytes() == b"dbn" for path in outputs(tmp_path))
    assert SENTINEL not in caplog.text and SENTINEL not in capsys.readouterr().out
    assert not list(tmp_path.glob(".*.tmp"))


def test_glbx_downloads_include_sunday_files_and_equities_do_not() -> None:
    import datetime as dt

    from marketrl.workflow.pipeline import batch_file_days

    start, end = dt.date(2024, 3, 8), dt.date(2024, 3, 12)  # Friday .. Monday (end exclusive)
    glbx = batch_file_days("GLBX.MDP3", start, end)
    # the Sunday evening open has a file, Saturday has none
    assert [d.isoformat() for d in glbx] == ["2024-03-08", "2024-03-10", "2024-03-11"]
    equities = batch_file_days("XNAS.ITCH", start, end)
    assert [d.isoformat() for d in equities] == ["2024-03-08", "2024-03-11"]
