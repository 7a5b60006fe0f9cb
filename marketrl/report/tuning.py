"""Hyperopt section: parameter importances from an in-memory Optuna study rebuilt from the JSON trials."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances
from optuna.trial import TrialState

from marketrl.scoring.stats import is_finite_number
from marketrl.verdict.inputs import HyperoptSummary

# Below this many completed trials an importance estimate is noise; the section says so instead.
MIN_TRIALS_FOR_IMPORTANCE = 5
_STATES = {"COMPLETE": TrialState.COMPLETE, "PRUNED": TrialState.PRUNED, "FAIL": TrialState.FAIL}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def infer_distributions(trials: Sequence[dict[str, Any]]) -> dict[str, BaseDistribution]:
    """Search-space distributions implied by the sampled values (the JSON does not store them): integers →
    IntDistribution, floats → FloatDistribution (log scale when positive and spanning > 2 decades),
    anything else → CategoricalDistribution over the values seen."""
    values: dict[str, list[Any]] = {}
    for trial in trials:
        for name, value in (trial.get("params") or {}).items():
            values.setdefault(name, []).append(value)
    distributions: dict[str, BaseDistribution] = {}
    for name, seen in values.items():
        if all(isinstance(v, int) and not isinstance(v, bool) for v in seen):
            distributions[name] = IntDistribution(min(seen), max(seen))
        elif all(_is_number(v) for v in seen):
            low, high = float(min(seen)), float(max(seen))
            log = low > 0 and high / low > 100
            distributions[name] = FloatDistribution(low, high, log=log)
        else:
            choices = sorted(
                {v if isinstance(v, str | int | float | bool) else str(v) for v in seen}, key=str
            )
            distributions[name] = CategoricalDistribution(choices)
    return distributions


def rebuild_study(summary: HyperoptSummary) -> optuna.Study:
    """An in-memory study holding the summary's trials (states, params, values, intermediate values)."""
    direction = "minimize" if summary.data.get("direction") == "minimize" else "maximize"
    study = optuna.create_study(direction=direction, storage=optuna.storages.InMemoryStorage())
    distributions = infer_distributions(summary.trials)
    frozen = []
    for trial in summary.trials:
        state = _STATES.get(str(trial.get("state")))
        value = trial.get("value")
        if state is None or (state == TrialState.COMPLETE and not is_finite_number(value)):
            continue
        params = {
            k: (v if isinstance(v, str | int | float | bool) else str(v))
            for k, v in (trial.get("params") or {}).items()
        }
        intermediate = {
            int(step): float(v)
            for step, v in (trial.get("intermediate") or {}).items()
            if str(step).lstrip("-").isdigit() and is_finite_number(v)
        }
        frozen.append(
            optuna.trial.create_trial(
                state=state,
                params=params,
                distributions={k: distributions[k] for k in params},
                value=float(value) if state == TrialState.COMPLETE else None,
                intermediate_values=intermediate,
            )
        )
    study.add_trials(frozen)
    return study


def param_importances(summary: HyperoptSummary) -> tuple[dict[str, float], str]:
    """(importances, message): empty importances with the reason when there are too few usable trials."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = rebuild_study(summary)
    except (ValueError, TypeError) as err:
        return {}, f"the trials could not be rebuilt as an Optuna study ({err})"
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < MIN_TRIALS_FOR_IMPORTANCE:
        return {}, (
            f"{len(complete)} completed trial(s): parameter importances need at least "
            f"{MIN_TRIALS_FOR_IMPORTANCE}"
        )
    varied = [name for name in study.best_trial.params if len({t.params.get(name) for t in complete}) > 1]
    if not varied:
        return {}, "no hyperparameter varied across the completed trials"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PED-ANOVA is marked experimental; the warning is not actionable
            importances = get_param_importances(study, evaluator=PedAnovaImportanceEvaluator(), params=varied)
    except (ValueError, RuntimeError) as err:
        return {}, f"parameter importances could not be estimated ({err})"
    return {name: float(value) for name, value in importances.items()}, ""


def best_params_rows(summary: HyperoptSummary) -> list[tuple[str, Any]]:
    """(name, value) of the best trial's parameters, hidden_dim_base first."""
    best = summary.data.get("best_params") or {}
    if not isinstance(best, dict):
        return []
    return sorted(best.items(), key=lambda kv: (kv[0] != "hidden_dim_base", kv[0]))


def per_fold_rows(by_fold: Mapping[int, HyperoptSummary]) -> tuple[list[str], list[dict[str, Any]]]:
    """Nested tuning's choices, fold by fold: (parameter names, hidden_dim_base first; one row per fold with its
    tuning window, trial count, best value and best parameters), to see whether a choice wanders."""
    names: set[str] = set()
    rows = []
    for fold in sorted(by_fold):
        data = by_fold[fold].data
        best = data.get("best_params") if isinstance(data.get("best_params"), dict) else {}
        names.update(best)
        window = data.get("tuning_window") or {}
        rows.append(
            {
                "fold": fold,
                "window": f"{window.get('first_day', '?')}..{window.get('last_day', '?')}",
                "validation": f"{window.get('validation_first', '?')}..{window.get('validation_last', '?')}",
                "n_trials": data.get("n_trials", len(by_fold[fold].trials)),
                "best_value": data.get("best_value"),
                "params": best,
            }
        )
    return sorted(names, key=lambda name: (name != "hidden_dim_base", name)), rows
