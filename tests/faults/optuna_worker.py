"""A hyperopt worker on a cheap objective, runnable as a process that a test kills in the middle of trial 2.

`python -m tests.faults.optuna_worker RESULTS_DIR MODE`: `run` completes the study; `hold` stops inside trial 2 after
drawing all its parameters, `hold_partial` after drawing only the first one (touching RESULTS_DIR/in_trial_2), until
killed. Like the real objective, trials mark when their parameters are all drawn. Config and seeds are fixed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import optuna

from marketrl.settings.config import validate_config
from marketrl.training.hyperopt import SAMPLED, load_study, work_on_study

N_TRIALS = 4
SAMPLER_SEED = 17
CONFIG = validate_config({"seed": 3, "hyperopt": {"n_trials": N_TRIALS, "workers": 1}})


def study(results: Path) -> optuna.Study:
    """The worker's study (created or resumed)."""
    return load_study(CONFIG, "dqn", 0, results)


def main(results: Path, mode: str = "run") -> None:
    """Run the worker; `hold` / `hold_partial` block inside trial 2 until killed."""

    def stop_here(trial: optuna.Trial, where: str) -> None:
        if mode == where and trial.number == 2:
            (results / "in_trial_2").touch()
            time.sleep(600)

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", -2.0, 2.0)
        stop_here(trial, "hold_partial")
        y = trial.suggest_int("y", 0, 9)
        trial.set_user_attr(SAMPLED, True)
        stop_here(trial, "hold")
        return -((x - 0.3) ** 2) + 0.01 * y

    work_on_study(study(results), "dqn", N_TRIALS, objective, results, seed=SAMPLER_SEED)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
