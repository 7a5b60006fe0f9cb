"""One Optuna study per model (each name of training.models) on the tuning window, shared by any number of workers;
with hyperopt.per_fold (nested tuning) one study per model x fold, each on its fold's own tuning window.

- Every model is tuned the same way (`marketrl.training.zoo` dispatches by name): its own search space, the same objective
  (validation Sharpe, the median over hyperopt.seeds_per_trial seeds), the same summary JSON.
- Data are loaded and moved to the device once per worker process; every trial reuses them.
- The tuning window ends before the first test day of any fold (marketrl.splits.folds); trials train on its inner train
  rows and are scored on its validation tail, net of costs. Costs are never tuned.
- Storage, trial claims and dead-worker recovery live in marketrl.training.study_storage: a journal file under
  results/hyperopt/{model}/ or PostgreSQL (claims and heartbeats in the database); together the workers run exactly
  hyperopt.n_trials, and a killed worker's trial is re-run in its slot with the same parameters and seeds.
- NaN/inf or diverged trials are pruned, not crashed; the MedianPruner prunes on intermediate validation scores.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna

from gpu_utils import HardwareBudget, PrecisionPlan, detect_precision, resolve_device
from marketrl.calendars.annual import ANNUALIZER
from marketrl.runtime.io import write_json_atomic
from marketrl.runtime.provenance import collect, package_versions, sha256_file
from marketrl.runtime.testing_hooks import hold_point
from marketrl.scoring.metrics import to_json_safe
from marketrl.settings.config import ConfigError, derive_seed
from marketrl.splits.datasets import (
    WindowData,
    env_config_from_config,
    load_features_for_days,
    tuning_window,
)
from marketrl.splits.folds import FoldPlan
from marketrl.training.study_storage import (  # claims, storage and recovery; the rest is re-exported for callers
    INTERRUPTED,  # noqa: F401
    OWNER,
    SAMPLED,
    SLOT,
    HyperoptError,
    JournalFlock,  # noqa: F401
    claim_trial,  # noqa: F401
    counted_trials,
    make_sampler,
    open_storage,
    recover_interrupted,  # noqa: F401
    storage_label,
    study_lock,  # noqa: F401
    trial_claims,
    work_on_study,
)
from marketrl.training.zoo import SearchSpace, TrainRequest, get_entry, positions_sharpe

log = logging.getLogger(__name__)

OBJECTIVE = (
    "annualized Sharpe ratio of daily net returns (after costs) on the tuning window's validation tail"
)


# ------------------------------------------------------------------------------------------------------ storage


def study_name(model: str, key: str = "", fold: int | None = None) -> str:
    """The Optuna study name of a model; `key` (see `study_key`) tells apart studies of different inputs,
    `fold` the per-fold studies (hyperopt.per_fold) that share the model's storage."""
    base = f"marketrl-{model}" if fold is None else f"marketrl-{model}-fold{fold}"
    return f"{base}-{key}" if key else base


def study_scope(model: str, fold: int | None = None) -> tuple[str | int, ...]:
    """What a study's seeds derive from besides their purpose: the model, and the fold of a per-fold study
    (so the folds' studies draw independent parameters; the single study keeps its seeds)."""
    return (model,) if fold is None else (model, "fold", fold)


def study_key(config: Mapping[str, Any], input_paths: Sequence[str | Path], code: str) -> str:
    """What a trial's result depends on: the config slice, the input files' bytes and the stage's code hash.

    A rerun of hyperopt after any of them changed starts a fresh study instead of finding the old one full;
    an interrupted run with the same inputs resumes its own. hyperopt.n_trials is left out (a larger value
    extends the study) and so is hyperopt.storage (where the study lives, not what it computes).
    """
    relevant = copy.deepcopy(dict(config))
    relevant["hyperopt"] = {
        k: v for k, v in relevant.get("hyperopt", {}).items() if k not in ("n_trials", "storage")
    }
    digest = hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode())
    for path in input_paths:
        digest.update(sha256_file(path).encode())
    digest.update(code.encode())
    return digest.hexdigest()[:12]


def fixed_params(config: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The parameters hyperopt.fixed pins for `model` (empty: all searched)."""
    return dict(config["hyperopt"].get("fixed", {}).get(model, {}))


def _inside(distribution: optuna.distributions.BaseDistribution, value: Any) -> bool:
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        # 1 and 1.0 match; True and 1 do not
        return any(
            value == choice and isinstance(value, bool) == isinstance(choice, bool)
            for choice in distribution.choices
        )
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(distribution, optuna.distributions.IntDistribution) and not float(value).is_integer():
        return False
    return bool(distribution.low <= value <= distribution.high)  # type: ignore[attr-defined]


def _described(distribution: optuna.distributions.BaseDistribution) -> str:
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return "one of " + ", ".join(repr(choice) for choice in distribution.choices)
    return f"{distribution.low} … {distribution.high}"  # type: ignore[attr-defined]


def check_fixed(space: SearchSpace, fixed: Mapping[str, Any], model: str, probes: int = 64) -> None:
    """hyperopt.fixed.<model>: every name is one of the search's parameters and every value inside its range or
    choices (the ranges bound a trial's cost); a one-line ConfigError naming the key otherwise.

    The space is probed with `probes` random draws of a throwaway in-memory study, so parameters that only some
    draws suggest (conditional ones) are found too."""
    if not fixed:
        return
    probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen: dict[str, list[optuna.distributions.BaseDistribution]] = {}
    for _ in range(probes):
        trial = probe.ask()
        space(trial)
        for name, distribution in trial.distributions.items():
            seen.setdefault(name, []).append(distribution)
        probe.tell(trial, 0.0)
    for name, value in fixed.items():
        key = f"hyperopt.fixed.{model}.{name}"
        if name not in seen:
            raise ConfigError(
                f"config key '{key}': not a parameter of {model}'s search (its parameters: {', '.join(sorted(seen))})"
            )
        if not any(_inside(distribution, value) for distribution in seen[name]):
            raise ConfigError(
                f"config key '{key}': {value!r} is outside {model}'s search ({_described(seen[name][0])})"
            )


def load_study(
    config: Mapping[str, Any],
    model: str,
    worker: int = 0,
    results_dir: str | Path = "results",
    name: str | None = None,
    fold: int | None = None,
) -> optuna.Study:
    """Create or resume the study `name` (default: `study_name(model, fold=fold)`); the TPE sampler is seeded per
    worker and pins the model's hyperopt.fixed parameters."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = make_sampler(
        derive_seed(config["seed"], "hyperopt", *study_scope(model, fold), worker),
        fixed_params(config, model),
    )
    pruner = optuna.pruners.MedianPruner(
        n_startup_trials=2, n_warmup_steps=config["hyperopt"]["pruner_warmup_evals"]
    )
    return optuna.create_study(
        study_name=name or study_name(model, fold=fold),
        storage=open_storage(config, model, results_dir),
        sampler=sampler,
        pruner=pruner,
        direction="maximize",
        load_if_exists=True,
    )


# ---------------------------------------------------------------------------------------------------- objective


def run_trial(
    trial: optuna.Trial,
    model: str,
    window: WindowData,
    config: Mapping[str, Any],
    device: Any,
    precision: PrecisionPlan,
    space: SearchSpace,
    budget: HardwareBudget | None = None,
    fold: int | None = None,
) -> float:
    """Train one configuration on the tuning train rows with hyperopt.seeds_per_trial seeds (one `train_seeds`
    batch); report the median of the seeds' validation scores for pruning; return the median of the seeds'
    final validation Sharpe ratios.

    The per-seed scores are the trial's user attribute ``seed_scores``; `space` is the model's search space
    (`marketrl.training.zoo`, built once per worker); `fold`, that of a per-fold study (its seeds' scope).
    """
    started = time.perf_counter()
    entry = get_entry(model, config["training"]["extra_models"])
    hparams = space(trial)
    trial.set_user_attr(SAMPLED, True)
    slot = trial.user_attrs.get(SLOT, trial.number)
    n_seeds = config["hyperopt"]["seeds_per_trial"]
    reports = 0

    def on_score(step: int, scores: list[float]) -> None:
        nonlocal reports
        score = float(statistics.median(scores))
        trial.report(score, reports)
        hold_point(f"hyperopt_trial_reported:{model}:{trial.number}")
        reports += 1
        if trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step} with validation Sharpe {score:.3f}")

    setup_s = time.perf_counter() - started
    trial.set_user_attr("setup_s", setup_s)
    # seed 0 keeps the seed of a one-seed trial, so hyperopt.seeds_per_trial=1 is the earlier objective
    seeds = tuple(
        derive_seed(
            config["seed"],
            "hyperopt-trial",
            *study_scope(model, fold),
            *((slot,) if number == 0 else (slot, number)),
        )
        for number in range(n_seeds)
    )
    runs = entry.train(
        TrainRequest(
            train_data=window.splits["train"],
            validation_data=window.splits["validation"],
            config=config,
            hparams=hparams,
            precision=precision,
            device=device,
            seeds=seeds,
            budget=entry.trial_budget(config),
            on_score=on_score,
            memory=budget,
        )
    )
    validation = window.splits["validation"]
    env_config = env_config_from_config(config)
    scores = [positions_sharpe(validation, run.positions(validation, env_config), env_config) for run in runs]
    trial.set_user_attr("seed_scores", list(scores))
    trial.set_user_attr("train_s", time.perf_counter() - started - setup_s)
    score = float(statistics.median(scores))
    trial.set_user_attr("val_sharpe_daily", score / ANNUALIZER)
    return score


def run_worker(
    *,
    model: str,
    worker: int,
    manifest_path: str,
    folds_path: str,
    config: Mapping[str, Any],
    out_path: str,
    results_dir: str | Path,
    code: str = "",
    fold: int | None = None,
) -> dict[str, Any]:
    """One worker: load the tuning window once, then claim and run trials until the study holds n_trials.

    The study lives under `results_dir` (see `study_dir`); it is shared by the workers, so it is no job's output.
    Its name carries `study_key` of the config, the inputs and `code` (the stage's code hash). `fold`: a worker of
    that fold's own study on that fold's tuning window (hyperopt.per_fold); None, of the model's one study.
    """
    started = time.perf_counter()
    entry = get_entry(model, config["training"]["extra_models"])
    device = resolve_device(config["training"]["device"])
    precision = detect_precision(device, config["training"]["precision"])
    plan = FoldPlan.load(folds_path)
    # only the tables and rows of the tuning window, not the whole history
    table = load_features_for_days(manifest_path, plan.tuning_for(fold).days, only_days=True)
    window = tuning_window(table, plan, config, device, fold)
    data_setup_s = time.perf_counter() - started
    budget = HardwareBudget.detect(device)
    space = entry.search_space(budget, window, config)
    check_fixed(space, fixed_params(config, model), model)
    log.info(
        "worker %d of %s%s (%s): tuning data on %s in %.2fs; precision %s",
        worker,
        model,
        "" if fold is None else f" fold {fold}",
        entry.kind,
        device,
        data_setup_s,
        precision.mode,
    )

    name = study_name(model, study_key(config, [manifest_path, folds_path], code), fold)
    study = load_study(config, model, worker, results_dir, name, fold)

    def objective(trial: optuna.Trial) -> float:
        return run_trial(trial, model, window, config, device, precision, space, budget, fold)

    sampler_seed = derive_seed(config["seed"], "hyperopt", *study_scope(model, fold))
    claims = trial_claims(config, model, results_dir)
    ran = work_on_study(
        study,
        model,
        config["hyperopt"]["n_trials"],
        objective,
        results_dir,
        seed=sampler_seed,
        claims=claims,
        fixed=fixed_params(config, model),
    )
    summary = {
        "algo": model,  # on-disk key kept for compatibility
        "kind": entry.kind,
        "fold": fold,
        "worker": worker,
        "study": name,
        "trials_run": ran,
        "data_setup_s": data_setup_s,
        "device": str(device),
        "precision": precision.to_dict(),
        "seeds_per_trial": config["hyperopt"]["seeds_per_trial"],
        "storage": storage_label(config, model, results_dir),
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
    model: str,
    worker_summaries: Sequence[str],
    folds_path: str | Path,
    config: Mapping[str, Any],
    out_path: str,
    results_dir: str | Path,
    fold: int | None = None,
) -> dict[str, Any]:
    """results/hyperopt/{model}.json (with `fold`, hyperopt.per_fold: results/hyperopt/{model}/fold_{fold}.json):
    best params (incl. hidden_dim_base), every trial, counts, provenance.

    Reads the study under `results_dir` (see `study_dir`) and the tuning window from `folds_path`.
    """
    workers = [json.loads(Path(path).read_text()) for path in worker_summaries]
    default = study_name(model, fold=fold)
    names = sorted({worker.get("study", default) for worker in workers}) or [default]
    if len(names) > 1:
        raise HyperoptError(f"{worker_summaries[0]}: workers of {model} ran different studies {names}")
    study = load_study(config, model, 0, results_dir, names[0], fold)
    trials = sorted(counted_trials(study), key=lambda t: t.number)
    states = [t.state for t in trials]
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(trials) != config["hyperopt"]["n_trials"]:
        raise HyperoptError(
            f"study {names[0]} holds {len(trials)} trials, expected hyperopt.n_trials="
            f"{config['hyperopt']['n_trials']} (is a worker still running?)"
        )
    if not complete:
        raise HyperoptError(
            f"study {names[0]}: no trial completed (all pruned or failed); see the worker logs"
        )
    best = max(complete, key=lambda t: (t.value, -t.number))
    window = FoldPlan.load(folds_path).tuning_for(fold)
    tuning = {
        "first_day": str(window.first_day),
        "last_day": str(window.last_day),
        "validation_first": str(window.validation_days[0]),
        "validation_last": str(window.validation_days[-1]),
    }
    summary = {
        "algo": model,  # on-disk key kept for compatibility
        "kind": get_entry(model, config["training"]["extra_models"]).kind,
        "fold": fold,  # None: the model's one study; k: fold k's own study (hyperopt.per_fold)
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
        "seeds_per_trial": config["hyperopt"]["seeds_per_trial"],
        "fixed_params": fixed_params(config, model),  # hyperopt.fixed: pinned in every trial, not searched
        "sampler": {
            "name": "TPESampler",
            "seed": derive_seed(config["seed"], "hyperopt", *study_scope(model, fold)),
            "reseeded": "per trial slot k: slot_sampler_seed(seed, k)",
        },
        "tuning_window": tuning,
        "storage": storage_label(config, model, results_dir),
        "workers": workers,
        "precision": workers[0]["precision"] if workers else None,
        "packages": package_versions(),
        "provenance": collect(dict(config)),
    }
    write_json_atomic(out_path, to_json_safe(summary))
    return summary
