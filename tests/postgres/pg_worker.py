"""A hyperopt worker process on a PostgreSQL study with a tiny objective (the real claim loop and claims).

    python -m tests.postgres.pg_worker URL N_TRIALS OUT_JSON [hold]

Runs `work_on_study` with `trial_claims` exactly as `run_worker` does, on a cheap three-parameter objective, and
writes the trial numbers it ran to OUT_JSON. `hold`: inside its first trial, after drawing every parameter, write
OUT_JSON.marker, print "IN_TRIAL <number>" and block until killed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import optuna

from marketrl.settings.config import derive_seed, validate_config
from marketrl.training.hyperopt import SAMPLED, load_study
from marketrl.training.study_storage import trial_claims, work_on_study

MODEL = "dqn"
HEARTBEAT_S = 0.2
GRACE_S = 1.5


def config(url: str, n_trials: int, workers: int = 1) -> dict:
    """The workers' config: PostgreSQL storage, quick heartbeats so a dead worker is noticed in seconds."""
    return validate_config(
        {
            "seed": 5,
            "hyperopt": {
                "n_trials": n_trials,
                "workers": workers,
                "storage": url,
                "heartbeat_seconds": HEARTBEAT_S,
                "grace_seconds": GRACE_S,
            },
        }
    )


def objective(trial: optuna.Trial) -> float:
    """A cheap deterministic function of three parameters of each kind."""
    x = trial.suggest_float("x", -2.0, 2.0)
    y = trial.suggest_int("y", 0, 9)
    z = trial.suggest_categorical("z", ("a", "b", "c"))
    trial.set_user_attr(SAMPLED, True)
    return -(x**2) - 0.1 * y + {"a": 0.0, "b": 0.5, "c": 1.0}[z]


def run(url: str, n_trials: int, out: Path, hold: bool = False) -> list[int]:
    """One worker until the study holds n_trials; `hold` blocks inside the first trial (see module doc)."""
    cfg = config(url, n_trials)

    def held(trial: optuna.Trial) -> float:
        value = objective(trial)
        if hold:
            Path(f"{out}.marker").write_text(str(trial.number))
            print(f"IN_TRIAL {trial.number}", flush=True)
            while True:  # until SIGKILL; the heartbeat thread keeps beating meanwhile
                time.sleep(60)
        return value

    study = load_study(cfg, MODEL, 0, out.parent)
    ran = work_on_study(
        study,
        MODEL,
        n_trials,
        held,
        out.parent,
        seed=derive_seed(cfg["seed"], "hyperopt", MODEL),
        claims=trial_claims(cfg, MODEL, out.parent),
    )
    out.write_text(json.dumps(ran))
    return ran


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), hold=sys.argv[4:] == ["hold"])
