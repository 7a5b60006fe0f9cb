"""One Optuna study per algorithm on the tuning window, shared by any number of worker jobs.

- Data are loaded and moved to the device once per worker process; every trial reuses them.
- The tuning window ends before the first test day of any fold (marketrl.folds); trials train on its inner train
  rows and are scored on its validation tail, net of costs. Costs are never tuned.
- Storage is persistent and resumable: a JournalFileStorage under results/hyperopt/{algo}/ (or an RDB URL from
  hyperopt.storage). Workers claim trials under a file lock so that together they run exactly hyperopt.n_trials;
  trials left RUNNING by a killed worker are marked failed ("interrupted") and their parameters re-enqueued.
- NaN/inf or diverged trials are pruned, not crashed; the MedianPruner prunes on intermediate validation scores.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna

from gpu_utils import HardwareBudget, NonFiniteError, PrecisionPlan, detect_precision, resolve_device
from marketrl.config import derive_seed
from marketrl.datasets import WindowData, env_config_from_config, load_features, tuning_window
from marketrl.env import MarketData, evaluate
from marketrl.folds import FoldPlan
from marketrl.io import write_json_atomic
from marketrl.metrics import performance_summary, to_json_safe
from marketrl.provenance import collect, package_versions
from marketrl.testing_hooks import hold_point
from marketrl.training import run_training

log = logging.getLogger(__name__)

OBJECTIVE = (
    "annualized Sharpe ratio of daily net returns (after costs) on the tuning window's validation tail"
)
HIDDEN_DIM_BASES = (64, 128, 256, 512)
# Per-bar returns are ~1e-4: rewards are multiplied by this before the losses (the objective is unaffected).
REWARD_SCALES = (1.0, 10.0, 100.0, 1000.0)
INTERRUPTED = "interrupted"
OWNER = "owner"
SLOT = "slot"  # the trial's place 0..n_trials-1 in the study; its sampler and training seeds derive from it
SAMPLED = "params_sampled"  # False from the claim until the objective has suggested every parameter


class HyperoptError(ValueError):
    """A study cannot run or be summarized (no completed trial, wrong trial count, bad storage)."""


# ----------------------------------------------------------------------------------------------- search spaces


def _batch_choices(low: int, high: int, candidates: Sequence[int]) -> list[int]:
    chosen = [size for size in candidates if low <= size <= high]
    return chosen or [max(low, min(candidates))]


def suggest_dqn(trial: optuna.Trial, batch_bounds: tuple[int, int]) -> dict[str, Any]:
    """DQN search space (docs/HYPEROPT.md)."""
    return {
        "hidden_dim_base": trial.suggest_categorical("hidden_dim_base", HIDDEN_DIM_BASES),
        "learning_rate": trial.suggest_float("learning_rate", 1e-5, 3e-3, log=True),
        "gamma": trial.suggest_float("gamma", 0.9, 0.999),
        "batch_size": trial.suggest_categorical(
            "batch_size", _batch_choices(*batch_bounds, (64, 128, 256, 512))
        ),
        "exploration_fraction": trial.suggest_float("exploration_fraction", 0.05, 0.5),
        "exploration_final_eps": trial.suggest_float("exploration_final_eps", 0.01, 0.1),
        "target_update": trial.suggest_categorical("target_update", (250, 500, 1000, 2000)),
        "gradient_steps": trial.suggest_categorical("gradient_steps", (1, 2, 4)),
        "reward_scale": trial.suggest_categorical("reward_scale", REWARD_SCALES),
    }


def suggest_ppo(trial: optuna.Trial, batch_bounds: tuple[int, int]) -> dict[str, Any]:
    """PPO search space (docs/HYPEROPT.md)."""
    return {
        "hidden_dim_base": trial.suggest_categorical("hidden_dim_base", HIDDEN_DIM_BASES),
        "learning_rate": trial.suggest_float("learning_rate", 1e-5, 3e-3, log=True),
        "gamma": trial.suggest_float("gamma", 0.9, 0.999),
        "gae_lambda": trial.suggest_float("gae_lambda", 0.8, 0.99),
        "n_steps": trial.suggest_categorical("n_steps", (32, 64, 128)),
        "n_epochs": trial.suggest_int("n_epochs", 2, 8),
        "batch_size": trial.suggest_categorical(
            "batch_size", _batch_choices(*batch_bounds, (256, 512, 1024, 2048))
        ),
        "clip_range": trial.suggest_float("clip_range", 0.1, 0.3),
        "ent_coef": trial.suggest_float("ent_coef", 1e-4, 5e-2, log=True),
        "reward_scale": trial.suggest_categorical("reward_scale", REWARD_SCALES),
    }


SEARCH_SPACES: dict[str, Callable[[optuna.Trial, tuple[int, int]], dict[str, Any]]] = {
    "dqn": suggest_dqn,
    "ppo": suggest_ppo,
}


# ------------------------------------------------------------------------------------------------------ storage


def study_dir(algo: str, results_dir: str | Path = "results") -> Path:
    """Where an algorithm's study keeps its journal and lock file."""
    return Path(results_dir) / "hyperopt" / algo


def open_storage(config: Mapping[str, Any], algo: str, results_dir: str | Path = "results") -> Any:
    """The study storage: an RDB URL from hyperopt.storage, else a JournalFileStorage under results/hyperopt/."""
    url = config["hyperopt"]["storage"].strip()
    if url:
        try:
            return optuna.storages.RDBStorage(url)
        except Exception as exc:  # SQLAlchemy raises many types; the user needs the key, not the class
            raise HyperoptError(
                f"config key 'hyperopt.storage': cannot open {url!r}: {exc}".splitlines()[0]
            ) from exc
    directory = study_dir(algo, results_dir)
    directory.mkdir(parents=True, exist_ok=True)
    backend = optuna.storages.journal.JournalFileBackend(
        str(directory / "journal.log"), lock_obj=JournalFlock(directory / "journal.lock")
    )
    return optuna.storages.JournalStorage(backend)


class JournalFlock:
    """The journal's write lock as a kernel file lock (flock), which dies with the process holding it.

    Optuna's default symlink lock outlives a worker killed mid-write: the next worker waits for a grace period,
    and forever when the journal path is relative (the lock's symlink then dangles, so its age is never read).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._handle: Any = None

    def acquire(self) -> bool:
        """Block until this process holds the lock."""
        handle = open(self.path, "a+")  # stays open while the lock is held
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        self._handle = handle
        return True

    def release(self) -> None:
        """Release the lock."""
        handle, self._handle = self._handle, None
        if handle is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            handle.close()


def load_study(
    config: Mapping[str, Any], algo: str, worker: int = 0, results_dir: str | Path = "results"
) -> optuna.Study:
    """Create or resume the algorithm's study; the TPE sampler is seeded per worker."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=derive_seed(config["seed"], "hyperopt", algo, worker))
    pruner = optuna.pruners.MedianPruner(
        n_startup_trials=2, n_warmup_steps=config["hyperopt"]["pruner_warmup_evals"]
    )
    return optuna.create_study(
        study_name=f"marketrl-{algo}",
        storage=open_storage(config, algo, results_dir),
        sampler=sampler,
        pruner=pruner,
        direction="maximize",
        load_if_exists=True,
    )


@contextmanager
def study_lock(algo: str, results_dir: str | Path = "results") -> Iterator[None]:
    """An exclusive lock shared by every worker of the study (a file lock on the shared filesystem)."""
    path = study_dir(algo, results_dir) / "study.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _owner_is_dead(owner: str) -> bool:
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's worker: only its own restart can tell
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def counted_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that count towards n_trials: everything except interrupted ones (whose params were re-enqueued)."""
    return [t for t in study.get_trials(deepcopy=False) if not t.user_attrs.get(INTERRUPTED)]


def slot_sampler_seed(seed: int, slot: int) -> int:
    """The TPE sampler seed of one trial slot, from the study's sampler seed root."""
    return derive_seed(seed, SLOT, slot)


def _waiting(trials: Sequence[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    return [t for t in trials if t.state == optuna.trial.TrialState.WAITING]


def recover_interrupted(study: optuna.Study) -> int:
    """Fail RUNNING trials whose worker on this host is gone, and re-enqueue their parameters; return the count."""
    recovered = 0
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        owner = trial.user_attrs.get(OWNER, "")
        if owner and _owner_is_dead(owner):
            study._storage.set_trial_user_attr(trial._trial_id, INTERRUPTED, True)
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            # The rerun keeps the trial's slot, hence its seeds, and its parameters once they were all drawn (a
            # partial set would shift the slot's sampler draws): the study ends as if it was never interrupted.
            slot = {SLOT: trial.user_attrs[SLOT]} if SLOT in trial.user_attrs else None
            params = trial.params if trial.user_attrs.get(SAMPLED, True) else {}
            study.enqueue_trial(params, user_attrs=slot, skip_if_exists=False)
            recovered += 1
    return recovered


def claim_trial(study: optuna.Study, n_trials: int, *, seed: int | None = None) -> optuna.Trial | None:
    """Start the next trial (a re-enqueued one first) unless the study already holds n_trials; call under
    `study_lock`.

    Every trial gets a slot (0..n_trials-1, kept by a re-enqueued trial). With `seed`, the sampler is reseeded
    per slot, so the parameters a slot draws do not depend on which worker process claims it or on restarts.
    """
    counted = counted_trials(study)
    waiting = _waiting(counted)
    if len(counted) - len(waiting) >= n_trials:
        return None
    free = sorted(set(range(n_trials)) - {t.user_attrs.get(SLOT) for t in counted})
    slot = free[0] if free else len(counted)
    if waiting:  # ask() pops the oldest waiting (re-enqueued) trial, which keeps its slot
        slot = waiting[0].user_attrs.get(SLOT, slot)
    if seed is not None:
        study.sampler = optuna.samplers.TPESampler(seed=slot_sampler_seed(seed, slot))
    trial = study.ask()
    if SLOT not in trial.user_attrs:
        trial.set_user_attr(SLOT, slot)
    trial.set_user_attr(SAMPLED, False)
    trial.set_user_attr(OWNER, _owner())
    return trial


def work_on_study(
    study: optuna.Study,
    algo: str,
    n_trials: int,
    objective: Callable[[optuna.Trial], float],
    results_dir: str | Path = "results",
    *,
    seed: int | None = None,
) -> list[int]:
    """Claim and run trials until the study holds `n_trials` (shared with other workers); return this worker's.

    `seed`: reseed the sampler per trial slot (see `claim_trial`).
    """
    with study_lock(algo, results_dir):
        recovered = recover_interrupted(study)
    if recovered:
        log.warning("re-enqueued %d trial(s) interrupted by a killed worker", recovered)
    ran: list[int] = []
    while True:
        with study_lock(algo, results_dir):
            trial = claim_trial(study, n_trials, seed=seed)
        if trial is None:
            return ran
        try:
            value = objective(trial)
        except optuna.TrialPruned as exc:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            log.info("trial %d pruned: %s", trial.number, exc)
        except NonFiniteError as exc:
            trial.set_user_attr("pruned_reason", str(exc).splitlines()[0])
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            log.warning("trial %d diverged and was pruned: %s", trial.number, exc)
        except BaseException:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        else:
            study.tell(trial, value)
            log.info("trial %d: validation Sharpe %.3f", trial.number, value)
        ran.append(trial.number)


# ---------------------------------------------------------------------------------------------------- objective


def validation_sharpe(policy: Callable, data: MarketData, config: Mapping[str, Any]) -> float:
    """The objective: annualized Sharpe of daily net returns of the greedy policy on `data` (0 when flat)."""
    bars = evaluate(policy, data, env_config_from_config(config))
    sharpe = performance_summary(bars)["sharpe"]
    return 0.0 if sharpe is None or not math.isfinite(sharpe) else float(sharpe)


def run_trial(
    trial: optuna.Trial,
    algo: str,
    window: WindowData,
    config: Mapping[str, Any],
    device: Any,
    precision: PrecisionPlan,
    batch_bounds: tuple[int, int],
) -> float:
    """Train one configuration on the tuning train rows, report validation scores, return the final one."""
    started = time.perf_counter()
    hparams = SEARCH_SPACES[algo](trial, batch_bounds)
    trial.set_user_attr(SAMPLED, True)
    seed = derive_seed(config["seed"], "hyperopt-trial", algo, trial.user_attrs.get(SLOT, trial.number))
    reports = 0

    def on_eval(step: int, policy: Callable) -> float:
        nonlocal reports
        score = validation_sharpe(policy, window.splits["validation"], config)
        trial.report(score, reports)
        hold_point(f"hyperopt_trial_reported:{algo}:{trial.number}")
        reports += 1
        if trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step} with validation Sharpe {score:.3f}")
        return score

    setup_s = time.perf_counter() - started
    trial.set_user_attr("setup_s", setup_s)
    result = run_training(
        algo,
        train_data=window.splits["train"],
        env_config=env_config_from_config(config),
        hparams=hparams,
        precision=precision,
        device=device,
        seed=seed,
        total_steps=config["hyperopt"]["trial_steps"],
        on_eval=on_eval,
        check_every=config["training"]["check_every"],
    )
    trial.set_user_attr("train_s", time.perf_counter() - started - setup_s)
    score = validation_sharpe(result.policy, window.splits["validation"], config)
    trial.set_user_attr("val_sharpe_daily", score / math.sqrt(252.0))
    return score


def run_worker(
    *,
    algo: str,
    worker: int,
    manifest_path: str,
    folds_path: str,
    config: Mapping[str, Any],
    out_path: str,
) -> dict[str, Any]:
    """One worker: load the tuning window once, then claim and run trials until the study holds n_trials."""
    results_dir = Path(out_path).parents[2]  # results/hyperopt/{algo}/worker_{w}.json
    started = time.perf_counter()
    device = resolve_device(config["training"]["device"])
    precision = detect_precision(device, config["training"]["precision"])
    plan = FoldPlan.load(folds_path)
    window = tuning_window(load_features(manifest_path), plan, config, device)
    data_setup_s = time.perf_counter() - started
    obs_dim = window.splits["train"].n_features * config["env"]["window"] + 1
    budget = HardwareBudget.detect(device)
    kind = "ppo" if algo == "ppo" else "dqn"
    batch_bounds = budget.batch_size_bounds(kind, obs_dim, max(HIDDEN_DIM_BASES))
    log.info(
        "worker %d of %s: tuning data on %s in %.2fs; precision %s",
        worker,
        algo,
        device,
        data_setup_s,
        precision.mode,
    )

    study = load_study(config, algo, worker, results_dir)

    def objective(trial: optuna.Trial) -> float:
        return run_trial(trial, algo, window, config, device, precision, batch_bounds)

    sampler_seed = derive_seed(config["seed"], "hyperopt", algo)
    ran = work_on_study(
        study, algo, config["hyperopt"]["n_trials"], objective, results_dir, seed=sampler_seed
    )
    summary = {
        "algo": algo,
        "worker": worker,
        "trials_run": ran,
        "data_setup_s": data_setup_s,
        "device": str(device),
        "precision": precision.to_dict(),
        "batch_bounds": list(batch_bounds),
    }
    write_json_atomic(out_path, to_json_safe(summary))
    return summary


# ------------------------------------------------------------------------------------------------------ summary


def _trial_record(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    return {
        "number": trial.number,
        "state": trial.state.name,
        "value": trial.value,
        "params": trial.params,
        "intermediate": {str(k): v for k, v in sorted(trial.intermediate_values.items())},
        "user_attrs": {k: v for k, v in trial.user_attrs.items() if k != OWNER},
    }


def write_study_summary(
    *,
    algo: str,
    worker_summaries: Sequence[str],
    config: Mapping[str, Any],
    out_path: str,
) -> dict[str, Any]:
    """results/hyperopt/{algo}.json: best params (incl. hidden_dim_base), every trial, counts, provenance."""
    results_dir = Path(out_path).parents[1]  # results/hyperopt/{algo}.json
    folds_path = results_dir / "folds.json"
    workers = [json.loads(Path(path).read_text()) for path in worker_summaries]
    study = load_study(config, algo, 0, results_dir)
    trials = sorted(counted_trials(study), key=lambda t: t.number)
    states = [t.state for t in trials]
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(trials) != config["hyperopt"]["n_trials"]:
        raise HyperoptError(
            f"study marketrl-{algo} holds {len(trials)} trials, expected hyperopt.n_trials="
            f"{config['hyperopt']['n_trials']} (is a worker still running?)"
        )
    if not complete:
        raise HyperoptError(
            f"study marketrl-{algo}: no trial completed (all pruned or failed); see the worker logs"
        )
    best = max(complete, key=lambda t: (t.value, -t.number))
    tuning = None
    if folds_path.exists():
        window = FoldPlan.load(folds_path).tuning
        tuning = {
            "first_day": str(window.first_day),
            "last_day": str(window.last_day),
            "validation_first": str(window.validation_days[0]),
            "validation_last": str(window.validation_days[-1]),
        }
    summary = {
        "algo": algo,
        "objective": OBJECTIVE,
        "direction": "maximize",
        "best_params": best.params,
        "best_value": best.value,
        "best_trial": best.number,
        "n_trials": len(trials),
        "n_complete": len(complete),
        "n_pruned": states.count(optuna.trial.TrialState.PRUNED),
        "n_failed": states.count(optuna.trial.TrialState.FAIL),
        "trials": [_trial_record(t) for t in trials],
        "trial_sharpe_daily": [
            t.user_attrs["val_sharpe_daily"] for t in complete if "val_sharpe_daily" in t.user_attrs
        ],
        "sampler": {
            "name": "TPESampler",
            "seed": derive_seed(config["seed"], "hyperopt", algo),
            "reseeded": "per trial slot k: slot_sampler_seed(seed, k)",
        },
        "tuning_window": tuning,
        "workers": workers,
        "precision": workers[0]["precision"] if workers else None,
        "packages": package_versions(),
        "provenance": collect(dict(config)),
    }
    write_json_atomic(out_path, to_json_safe(summary))
    return summary
