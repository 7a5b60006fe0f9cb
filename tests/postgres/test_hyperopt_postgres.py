"""Distributed hyperopt on a real PostgreSQL server: claims and heartbeats in the database, no shared file lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from marketrl.training.hyperopt import (
    INTERRUPTED,
    SLOT,
    HyperoptError,
    counted_trials,
    load_study,
    write_study_summary,
)
from marketrl.training.study_storage import HEARTBEATS_TABLE, STORAGE_ENV
from tests.conftest import REPO_ROOT
from tests.postgres import pg_worker
from tests.postgres.cluster import Cluster
from tests.test_hyperopt import write_fold_plan

N_TRIALS = 8  # within TPE's random start-up phase, where a slot's parameters depend only on its seed
PROCESS_TIMEOUT_S = 120


def _worker(url: str, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.postgres.pg_worker", url, str(N_TRIALS), str(out), *extra],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    assert proc.returncode == 0, err[-3000:]


def _study(url: str) -> optuna.Study:
    return load_study(pg_worker.config(url, N_TRIALS), "dqn", 0, "unused")


def _by_slot(study: optuna.Study) -> dict[int, tuple[dict, float]]:
    return {t.user_attrs[SLOT]: (t.params, t.value) for t in counted_trials(study)}


@pytest.fixture(scope="module")
def reference(postgres: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[dict, float]]:
    """Per-slot parameters and values of one worker alone on the study."""
    url = postgres.create_database("reference")
    pg_worker.run(url, N_TRIALS, tmp_path_factory.mktemp("reference") / "w0.json")
    by_slot = _by_slot(_study(url))
    assert sorted(by_slot) == list(range(N_TRIALS))
    return by_slot


def test_four_worker_processes_run_exactly_n_trials_as_one_worker_would(
    database: Callable[[], str], reference: dict, tmp_path: Path
) -> None:
    url = database()
    outs = [tmp_path / f"w{i}.json" for i in range(4)]
    procs = [_worker(url, out) for out in outs]
    for proc in procs:
        _finish(proc)
    ran = sorted(n for out in outs for n in json.loads(out.read_text()))
    study = _study(url)
    assert ran == list(range(N_TRIALS)) == sorted(t.number for t in study.trials)  # once each, none extra
    assert all(t.state.name == "COMPLETE" for t in study.trials)
    assert _by_slot(study) == reference  # same slot -> same parameters and value, whoever claimed it


def test_worker_killed_mid_trial_is_rerun_in_its_slot(
    database: Callable[[], str], reference: dict, tmp_path: Path
) -> None:
    url = database()
    victim = _worker(url, tmp_path / "victim.json", "hold")
    line = victim.stdout.readline()  # printed from inside the trial, after its marker file
    assert line.startswith("IN_TRIAL"), victim.stderr.read()[-3000:]
    held = int(line.split()[1])
    assert (tmp_path / "victim.json.marker").read_text() == str(held)
    survivor = _worker(url, tmp_path / "survivor.json")
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(PROCESS_TIMEOUT_S)
    _finish(survivor)  # it waits for the dead worker's trial, sees its heartbeat lapse, and re-runs its slot

    study = _study(url)
    interrupted = [t for t in study.trials if t.user_attrs.get(INTERRUPTED)]
    assert [t.number for t in interrupted] == [held] and interrupted[0].state.name == "FAIL"
    counted = counted_trials(study)
    assert len(counted) == N_TRIALS and all(t.state.name == "COMPLETE" for t in counted)
    rerun = [t for t in counted if t.user_attrs[SLOT] == interrupted[0].user_attrs[SLOT]]
    assert len(rerun) == 1 and rerun[0].params == interrupted[0].params  # same slot, same parameters
    assert _by_slot(study) == reference  # N and every slot as if nothing had crashed
    assert json.loads((tmp_path / "survivor.json").read_text()) == sorted(t.number for t in counted)
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(sqlalchemy.text(f"SELECT count(*) FROM {HEARTBEATS_TABLE}")).scalar()
    engine.dispose()
    assert rows == 0  # no heartbeat row outlives its trial


@pytest.mark.parametrize("where", ["wrong password", "unreachable port"])
def test_bad_server_or_credentials_name_the_config_key(postgres: Cluster, where: str) -> None:
    if where == "wrong password":
        url = postgres.url(password="not-the-password")
    else:
        url = f"postgresql://marketrl:secret-pw@127.0.0.1:{_closed_port()}/postgres"
    with pytest.raises(HyperoptError) as excinfo:
        load_study(pg_worker.config(url, 2), "dqn", 0, "unused")
    message = str(excinfo.value)
    assert message.startswith("config key 'hyperopt.storage': cannot open postgresql://marketrl@127.0.0.1:")
    assert "\n" not in message and "not-the-password" not in message and "secret-pw" not in message


def test_environment_variable_wins_and_is_named(postgres: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STORAGE_ENV, postgres.url(password="nope"))
    with pytest.raises(HyperoptError, match=r"'hyperopt.storage' \(from \$MARKETRL_OPTUNA_STORAGE\)"):
        load_study(pg_worker.config("", 2), "dqn", 0, "unused")  # the config says journal; the env var wins


def test_summary_shows_the_storage_without_its_password(
    database: Callable[[], str], postgres: Cluster, tmp_path: Path
) -> None:
    url = database()
    (tmp_path / "results").mkdir()
    pg_worker.run(url, N_TRIALS, tmp_path / "results" / "w0.json")
    summary = write_study_summary(
        model="dqn",
        worker_summaries=[],
        folds_path=write_fold_plan(tmp_path / "folds.json"),
        config=pg_worker.config(url, N_TRIALS),
        out_path=str(tmp_path / "results" / "hyperopt" / "dqn.json"),
        results_dir=tmp_path / "results",
    )
    text = (tmp_path / "results" / "hyperopt" / "dqn.json").read_text()
    assert postgres.password not in text
    assert summary["storage"] == url.replace(f":{postgres.password}@", "@")
    assert summary["provenance"]["config"]["hyperopt"]["storage"] == summary["storage"]
    assert not (tmp_path / "results" / "hyperopt" / "dqn" / "study.lock").exists()  # no file lock was used


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again when this returns: connections are refused
