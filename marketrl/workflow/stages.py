"""What each pipeline stage depends on besides its input files: its config slice and the hash of its code.

Both go into the stage's rule `params`, so Snakemake's params trigger reruns a stage exactly when a config key it
reads, or a source file it imports, changed. The job gets only its slice, so a key missing from the slice fails
the job with a KeyError instead of being read unnoticed (tests/test_dag_cache.py runs every stage on its slice).

Kept free of heavy imports: rules/common.smk calls it at every DAG parse.
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from marketrl.settings.registry import registered_modules

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS_DIR = REPO_ROOT / "workflow_scripts"
CODE_PACKAGES = (
    "marketrl",
    "gpu_utils",
)  # what a stage's code hash covers; tests and third-party code do not

_COSTS = tuple(
    f"costs.{k}"
    for k in (
        "bps",
        "commission_per_contract",
        "half_spread_ticks",
        "instruments",
        "model",
        "tick_size",
        "tick_value",
    )
)
_ENV = tuple(f"env.{k}" for k in ("contracts", "episode_length", "fill", "max_gap", "window"))
_FOLDS = tuple(
    f"folds.{k}"
    for k in (
        "embargo_bars",
        "max_train_days",
        "n",
        "scheme",
        "test_days",
        "train_days",
        "tuning_days",
        "tuning_validation_days",
        "validation_days",
    )
)
ALL_KEYS = "*"  # the report prints the whole config in its provenance section, so it reads every key...
# ...but those of the calibration and of predict, separate targets the pipeline's report neither runs nor shows.
NOT_IN_ALL_KEYS = ("calibration", "predict")

# The config keys each stage's job reads, key by key (stage = rule name = workflow_scripts/{stage}.py). Keys that
# only shape the DAG (data.source, training.models, hyperopt.workers, ...; see DAG_KEYS) change which jobs exist,
# not what a job computes, and are in no slice but the report's.
# What every calibration stage reads: its own slice and the verdict's rules.
_CALIBRATION = (
    "calibration.edge_kinds",
    "calibration.edges",
    "calibration.folds",
    "calibration.models",
    "calibration.per_fold_trials",
    "calibration.random_traders",
    "calibration.seeds",
    "calibration.test_days",
    "calibration.train_days",
    "calibration.validation_days",
    "calibration.worlds",
    "calibration.worlds_per_job",
    "evaluation.bootstrap_samples",
    "evaluation.min_seeds",
    "evaluation.min_test_days",
)

STAGE_KEYS: dict[str, tuple[str, ...] | str] = {
    "demo_data": (
        "data.demo.days",
        "data.demo.edge",
        "data.demo.edge_kind",
        "data.demo.seed",
        "data.demo.start",
    ),
    "download_databento": (
        "data.databento.dataset",
        "data.databento.max_cost_usd",
        "data.databento.schema",
        "data.databento.stype_in",
        "data.databento.symbols",
    ),
    "features": (
        "data.bar_size",
        "data.max_price_jump",
        "data.on_bad_file",
        "data.quotes",
        "data.session",
        "env.fill_delay",
        "features.user",
    ),
    "user_features_audit": ("features.user",),
    "feature_manifest": (),
    "folds": _FOLDS,
    "hyperopt_worker": (
        "seed",
        *_COSTS,
        *_ENV,
        "hyperopt.fixed",
        "hyperopt.grace_seconds",
        "hyperopt.heartbeat_seconds",
        "hyperopt.n_trials",
        "hyperopt.pruner_warmup_evals",
        "hyperopt.seeds_per_trial",
        "hyperopt.storage",
        "hyperopt.trial_steps",
        "hyperopt.trial_updates",
        "training.check_every",
        "training.device",
        "training.epochs",
        "training.extra_models",
        "training.horizon",
        "training.max_train_rows",
        "training.n_envs",
        "training.patience",
        "training.precision",
    ),
    "hyperopt_best": (
        "seed",
        "hyperopt.fixed",
        "hyperopt.n_trials",
        "hyperopt.pruner_warmup_evals",
        "hyperopt.seeds_per_trial",
        "hyperopt.storage",
        "training.extra_models",
    ),
    "train": (
        "seed",
        *_COSTS,
        *_ENV,
        "training.check_every",
        "training.checkpoint_every",
        "training.device",
        "training.epochs",
        "training.extra_models",
        "training.gate_min_t",
        "training.horizon",
        "training.max_train_rows",
        "training.max_updates",
        "training.n_envs",
        "training.patience",
        "training.precision",
        "training.total_steps",
    ),
    "evaluate": (
        "seed",
        *_COSTS,
        *_ENV,
        "evaluation.random_baseline_seeds",  # the turnover-matched random traders beside each agent run
        "training.device",
        "training.extra_models",
        "training.n_envs",
        "training.pooled_min_t",  # a fold whose record fails trades on its seeds' pooled validation t
        "training.record_min_t",  # the walk-forward record's gate (marketrl.scoring.gate)
    ),
    "baselines": (
        "seed",
        *_COSTS,
        *_ENV,
        "evaluation.momentum_lookback",
        "evaluation.random_baseline_seeds",
        "training.n_envs",
    ),
    "report": ALL_KEYS,
    # The verdict's calibration (marketrl/calibration/worlds.py): synthetic worlds, each with its own data, folds and
    # models from the calibration slice, scored like the report scores a run.
    "calibration_worlds": (
        "seed",
        *_COSTS,
        *_ENV,
        *_CALIBRATION,
        "evaluation.momentum_lookback",
        "training.gate_min_t",
        "training.n_envs",
        "training.pooled_min_t",
        "training.record_min_t",
    ),
    "calibration": _CALIBRATION,
    # Trained models applied to new files (marketrl/evaluation/predict.py): scored like evaluate scores a model.
    "predict": (
        *_COSTS,
        *_ENV,
        "predict.fold",
        "training.device",
        "training.extra_models",
        "training.n_envs",
        "training.pooled_min_t",
        "training.record_min_t",
    ),
    # Exported models (marketrl/training/export.py): everything else comes from the checkpoint itself.
    "export": ("training.extra_models",),
}

# Keys that decide which jobs (and files) exist, or how they are scheduled (rules/common.smk; a few a job reads too).
DAG_KEYS: dict[str, str] = {
    "data.source": "input files",
    "data.files": "input files",
    "data.quotes": "features' quote inputs",
    "data.definitions": "costs.instruments (merged at DAG parse)",
    "data.demo.days": "input files",
    "data.demo.start": "input files",
    "data.databento.start": "input files",
    "data.databento.end": "input files",
    "data.databento.dataset": "input file names",
    "data.databento.schema": "input file names",
    "calibration.edge_kinds": "calibration jobs",
    "calibration.edges": "calibration jobs",
    "calibration.per_fold_trials": "calibration jobs",
    "calibration.test_days": "calibration jobs",
    "calibration.worlds": "calibration jobs",
    "calibration.worlds_per_job": "calibration jobs",
    "folds.n": "fold jobs",
    "hyperopt.workers": "worker jobs",
    "hyperopt.per_fold": "study jobs per fold; train's hparams input (train, evaluate rerun)",
    "training.models": "model jobs",
    "training.seeds": "seed jobs",
    "training.gpu_jobs": "gpu resource only",
    "training.batch_folds": "train jobs (one per model, or per model x fold): a switch reruns train, evaluate",
    "training.device": "gpu resource",
    "features.user": "user_features_audit job",
    "features.batch": "features jobs (per month or per file); a change reruns them (new job inputs) and what follows",
    "predict.files": "predict jobs",
    "predict.models": "predict jobs",
    "predict.fold": "predict jobs' model inputs",
}

# Which stages read each stage's outputs (mirrors the rules' inputs; tests check it against Snakemake's rulegraph).
DOWNSTREAM: dict[str, tuple[str, ...]] = {
    "demo_data": ("features",),
    "download_databento": ("features",),
    "user_features_audit": ("features",),
    # predict_features is the features rule on new files
    "features": ("feature_manifest", "folds", "predict"),
    "feature_manifest": ("hyperopt_worker", "train", "evaluate", "baselines", "report", "predict"),
    "folds": ("hyperopt_worker", "hyperopt_best", "train", "evaluate", "baselines", "report", "predict"),
    "hyperopt_worker": ("hyperopt_best",),
    "hyperopt_best": ("train", "report"),
    "train": ("evaluate", "report", "predict", "export"),
    # a fold's evaluation reads the earlier folds' metrics (the walk-forward record), and predict a fold's record
    "evaluate": ("evaluate", "report", "predict"),
    "baselines": ("report",),
    "report": (),
    "calibration_worlds": ("calibration",),
    "calibration": (),
    "predict": (),
    "export": (),
}
STAGES = tuple(DOWNSTREAM)

# Mappings keyed by model name, of which a model's jobs get only their own entry (`stage_config(..., model=)`):
# registering one more model by config changes no other model's job params, so it reruns nothing else.
PER_MODEL_KEYS = ("hyperopt.fixed", "training.extra_models")


class StageError(ValueError):
    """An unknown stage name (a rule and this table disagree)."""


def _keys_of(stage: str) -> tuple[str, ...] | str:
    try:
        return STAGE_KEYS[stage]
    except KeyError:
        raise StageError(f"unknown stage {stage!r} (expected one of {', '.join(STAGES)})") from None


def stage_config(config: Mapping[str, Any], stage: str, model: str | None = None) -> dict[str, Any]:
    """The part of a validated config that `stage` reads: nested like the config, keys in sorted order.

    ``model``: the slice of one model's job, where each of `PER_MODEL_KEYS` holds only that model's entry.
    """
    keys = _keys_of(stage)
    if keys == ALL_KEYS:
        keys = tuple(k for k in config_keys(config) if _in_all_keys(k))
    sliced: dict[str, Any] = {}
    for dotted in sorted(keys):
        *sections, leaf = dotted.split(".")
        source, target = config, sliced
        for section in sections:
            source = source[section]
            target = target.setdefault(section, {})
        value = source[leaf]
        if model is not None and dotted in PER_MODEL_KEYS:
            value = {name: entry for name, entry in value.items() if name == model}
        target[leaf] = copy.deepcopy(value)
    return sliced


def _in_all_keys(key: str) -> bool:
    return key.split(".", 1)[0] not in NOT_IN_ALL_KEYS


# Mappings that a stage reads as one value (their keys are the user's: symbol roots, calendar fields, model names).
WHOLE_VALUE_KEYS = ("costs.instruments", "data.session", "hyperopt.fixed", "training.extra_models")


def config_keys(config: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Every leaf key of a (nested) config as a dotted path; `WHOLE_VALUE_KEYS` count as leaves."""
    for key, value in config.items():
        if isinstance(value, Mapping) and f"{prefix}{key}" not in WHOLE_VALUE_KEYS:
            yield from config_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def readers(key: str) -> list[str]:
    """The stages whose slice holds `key` (a dotted config key)."""
    return [
        stage
        for stage in STAGES
        if (STAGE_KEYS[stage] == ALL_KEYS and _in_all_keys(key)) or key in STAGE_KEYS[stage]
    ]


def downstream_closure(stages: list[str]) -> list[str]:
    """`stages` and every stage that reads their outputs, directly or not, in pipeline order."""
    reached = set(stages)
    frontier = list(stages)
    while frontier:
        for child in DOWNSTREAM[frontier.pop()]:
            if child not in reached:
                reached.add(child)
                frontier.append(child)
    return [stage for stage in STAGES if stage in reached]


def reruns(key: str) -> list[str]:
    """Stages a change of `key` reruns after a finished run: its readers and everything downstream of them."""
    return downstream_closure(readers(key))


def config_key_table(config: Mapping[str, Any]) -> str:
    """Markdown table: every key of `config` -> the stages that read it, the stages its change reruns after a
    finished run, and which jobs it adds or removes (DAG_KEYS)."""
    lines = [
        "| config key | read by (besides the report) | a change reruns | also decides |",
        "|---|---|---|---|",
    ]
    for key in sorted(config_keys(config)):
        direct = [s for s in readers(key) if s != "report"]
        read_by = ", ".join(direct) if direct else "-"
        lines.append(f"| `{key}` | {read_by} | {', '.join(reruns(key))} | {DAG_KEYS.get(key, '')} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- code hashes


def _module_file(module: str) -> Path | None:
    """The source file of a module of CODE_PACKAGES in this checkout (None for anything else)."""
    parts = module.split(".")
    if parts[0] not in CODE_PACKAGES:
        return None
    base = REPO_ROOT.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


# Whoever imports the registry's loader imports, at run time, every module the registry names.
SPEC_LOADER = "marketrl.settings.registry.load_spec"


@functools.cache
def _imported_modules(path: Path, module: str) -> frozenset[str]:
    """Names a file imports anywhere (module level or inside functions), relative imports resolved; a file that
    imports `SPEC_LOADER` also imports the registered model modules."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
    if SPEC_LOADER in names:
        names.update(registered_modules())
    return frozenset(names)


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _package_data(init: Path) -> list[Path]:
    """Non-Python files a package ships (e.g. report templates), outside its subpackages."""
    files = []
    for path in init.parent.rglob("*"):
        inner = path.relative_to(init.parent).parts
        in_subpackage = any(
            (init.parent.joinpath(*inner[: i + 1]) / "__init__.py").is_file() for i in range(len(inner) - 1)
        )
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in inner:
            if not in_subpackage:
                files.append(path)
    return files


@functools.cache
def stage_sources(stage: str) -> tuple[Path, ...]:
    """The workflow script of `stage` and every file of CODE_PACKAGES it imports, recursively (a static walk)."""
    script = SCRIPTS_DIR / f"{stage}.py"
    if not script.is_file():
        raise StageError(f"stage {stage!r} has no script {script.relative_to(REPO_ROOT)}")
    seen: dict[str, Path] = {}
    pending = [(script, "")]
    files = {script}
    while pending:
        path, module = pending.pop()
        for name in _imported_modules(path, module):
            for candidate in _with_parents(name):
                found = _module_file(candidate)
                if found is not None and candidate not in seen:
                    seen[candidate] = found
                    files.add(found)
                    pending.append((found, candidate))
                    if found.name == "__init__.py":
                        files.update(_package_data(found))
    return tuple(sorted(files))


def user_features_hash(config: Mapping[str, Any]) -> str:
    """Hash of the ``features.user`` file's content ("" without one): a param of the stages that run it, so that
    editing the file reruns the audit, the features and everything downstream, and an unchanged file nothing."""
    user = config["features"]["user"]
    return hashlib.sha256(Path(user).read_bytes()).hexdigest()[:16] if user else ""


@functools.cache
def code_hash(stage: str) -> str:
    """Hash of every source file `stage` runs; a rule param, so that Snakemake reruns the stage when it changes."""
    digest = hashlib.sha256()
    for path in stage_sources(stage):
        digest.update(path.relative_to(REPO_ROOT).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
