"""Packaging: one lock file with exact pins, and a conda env file carrying the same pins."""

from __future__ import annotations

import re
import tomllib

import yaml

from tests.conftest import REPO_ROOT

PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)$")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO_ROOT / "requirements.lock").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"requirements.lock: not an exact pin: {line!r}"
        pins[_normalize(match.group(1))] = match.group(2)
    return pins


def test_lock_pins_torch_2_13() -> None:
    assert _lock_pins()["torch"] == "2.13.0"


def test_conda_env_matches_lock() -> None:
    env = yaml.safe_load((REPO_ROOT / "envs" / "pipeline.yaml").read_text())
    assert "python=3.11" in env["dependencies"]
    pip_section = next(dep["pip"] for dep in env["dependencies"] if isinstance(dep, dict))
    conda_pins = {}
    for entry in pip_section:
        match = PIN.match(entry)
        assert match, f"envs/pipeline.yaml: not an exact pin: {entry!r}"
        conda_pins[_normalize(match.group(1))] = match.group(2)
    assert conda_pins == _lock_pins()


def test_every_declared_dependency_is_pinned() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared += extra
    pins = _lock_pins()
    for requirement in declared:
        name = _normalize(re.split(r"[<>=!\[ ;]", requirement, maxsplit=1)[0])
        assert name in pins, (
            f"{requirement} is declared in pyproject.toml but not pinned in requirements.lock"
        )
