# Validation beyond the schema, wildcard constraints, every input and params function (rules hold no lambdas).
import sys

from marketrl.settings import paths
from marketrl.workflow import pipeline, resources, stages
from marketrl.calibration.plan import (
    CalibrationError,
    CalibrationSettings,
    n_jobs,
)
from marketrl.settings.config import ConfigError, check_contract_specs, validate_config
from marketrl.data.definitions import resolve_definitions

# Fill defaults, run the schema and cross-key checks, merge the contract specs of data.definitions and check that
# futures have one (there is no default contract). A bad config prints one line naming the key (and no schema dump
# or traceback), then stops before any job runs.
try:
    config.update(validate_config(config))
    config.update(resolve_definitions(config))  # data.definitions -> costs.instruments
    check_contract_specs(config)
    RAW_FILES = pipeline.raw_data_files(config)
    QUOTE_FILES = pipeline.quote_inputs(config)  # data.quotes, per bar file
    FEATURE_BATCHES = pipeline.feature_batches(config)  # features.batch: stems per job
    CALIBRATION_JOBS = n_jobs(CalibrationSettings.from_config(config))
    # predict.files x predict.models (docs/PREDICT.md)
    PREDICT_OUTPUTS = pipeline.predict_outputs(config)
except (ConfigError, CalibrationError) as err:
    print(f"marketrl config error: {err}", file=sys.stderr)
    sys.exit(1)

GPU_UNITS = pipeline.gpu_units(config)
ENV_FILE = "../envs/pipeline.yaml"
NO_MODEL = "(?!)"  # a regex that matches nothing: a rule for a kind of model the config does not run
STOCHASTIC_MODELS = "|".join(pipeline.stochastic_models(config)) or NO_MODEL
# training.batch_folds: one train job per model trains every fold (rule train_folds), else one per model x fold
BATCH_FOLDS = pipeline.batch_folds(config)
FOLD_TRAINED_MODELS = NO_MODEL if BATCH_FOLDS else STOCHASTIC_MODELS
FOLDS_BATCHED_MODELS = STOCHASTIC_MODELS if BATCH_FOLDS else NO_MODEL
FOLD_INDICES = pipeline.fold_indices(config)
DETERMINISTIC_MODELS = "|".join(pipeline.deterministic_models(config)) or NO_MODEL
# hyperopt.per_fold (nested tuning): the hyperopt rules write one study per model x fold ({fold} in their paths).
PER_FOLD = pipeline.per_fold(config)
HYPEROPT_WORKER_OUTPUT = (
    paths.HYPEROPT_FOLD_WORKER if PER_FOLD else paths.HYPEROPT_WORKER
)
HYPEROPT_BEST_OUTPUT = paths.HYPEROPT_FOLD_BEST if PER_FOLD else paths.HYPEROPT_BEST
HYPEROPT_WORKER_LOG = (
    "hyperopt/{model}/fold_{fold}/worker_{worker}"
    if PER_FOLD
    else "hyperopt/{model}/worker_{worker}"
)
HYPEROPT_BEST_LOG = (
    "hyperopt/{model}/fold_{fold}_best" if PER_FOLD else "hyperopt/{model}_best"
)


wildcard_constraints:
    stem=r"[^/]+",
    model="|".join(config["training"]["models"]),
    fold=r"\d+",
    seed=r"\d+",
    worker=r"\d+",
    job=r"\d+",


def stage_config(stage):
    """The config keys `stage` reads (in params, so that changing one of them reruns the stage)."""
    return stages.stage_config(config, stage)


def model_stage_config(stage):
    """The config keys `stage` reads, for the job of one model ({model}): in it, each per-model mapping
    (stages.PER_MODEL_KEYS, e.g. training.extra_models) holds only that model's entry.
    """

    def for_model(wildcards):
        return stages.stage_config(config, stage, model=wildcards.model)

    return for_model


def code_hash(stage):
    """Hash of the library code `stage` imports (in params, so that changing that code reruns the stage)."""
    return stages.code_hash(stage)


def memory_limit_mb():
    """The mem_mb Snakemake was given (--resources mem_mb=N, as make run does), or None."""
    value = getattr(workflow.resource_settings.resources.get("mem_mb"), "value", None)
    return value if isinstance(value, int) else None


MEM_LIMIT_MB = memory_limit_mb()


def fixed_mem_mb(rule_name):
    """`resources: mem_mb` of a rule whose data do not grow with the history (resources.FIXED_MB, measured),
    at most the limit Snakemake was given (resources.within_limit)."""
    return resources.within_limit(resources.FIXED_MB[rule_name], MEM_LIMIT_MB)


def train_mem_mb(wildcards, input):
    """`resources: mem_mb` of a train job: the model's memory model at its fold's window (rows x features of
    the manifest and fold plan, the best hyperparameters' window for LightGBM and ridge; Snakemake evaluates it
    again once they exist, before the job starts).
    """
    request = resources.train_mem_mb(
        config,
        wildcards.model,
        int(wildcards.fold),
        input.manifest,
        input.folds,
        input.hparams,
    )
    return resources.within_limit(request, MEM_LIMIT_MB)


def train_folds_mem_mb(wildcards, input):
    """`resources: mem_mb` of a fold-batched train job: every fold's window, folds x seeds at once."""
    request = resources.train_folds_mem_mb(
        config,
        wildcards.model,
        FOLD_INDICES,
        input.manifest,
        input.folds,
        input.hparams[0],
    )
    return resources.within_limit(request, MEM_LIMIT_MB)


def tuning_mem_mb(wildcards, input):
    """`resources: mem_mb` of a hyperopt worker: the model's memory model at its study's tuning window."""
    fold = wildcards.get("fold")
    request = resources.tuning_mem_mb(
        config,
        wildcards.model,
        None if fold is None else int(fold),
        input.manifest,
        input.folds,
    )
    return resources.within_limit(request, MEM_LIMIT_MB)


def calibration_chunks():
    """The chunk files of the calibration's world jobs (calibration.worlds_per_job worlds each)."""
    return [paths.CALIBRATION_CHUNK.format(job=job) for job in range(CALIBRATION_JOBS)]


def feature_batch_files(stems):
    """Per file of a features batch (time order): its table (dst), source, context (the files before it,
    pipeline.CONTEXT_FILES of them, as lookback; the job decodes only as many as the lookbacks need) and
    data.quotes files, for the job script (params: the inputs alone do not say which file is whose context).
    """
    return pipeline.feature_batch_files(RAW_FILES, stems, QUOTE_FILES)


def feature_batch_inputs(stems):
    """Every file a features batch reads (data: its files, their context and quotes; audit: the user features'
    audit, audited before any features job runs, with features.user)."""
    files = []
    for entry in feature_batch_files(stems):
        for path in [entry["src"], *entry["context"], *entry["quotes"]]:
            if path not in files:
                files.append(path)
    inputs = {"data": files}
    if config["features"]["user"]:
        inputs["audit"] = paths.USER_FEATURES_AUDIT
    return inputs


def user_features_file():
    """The features.user file the audit reads (none without one: then no job asks for the audit)."""
    return [config["features"]["user"]] if config["features"]["user"] else []


def user_features_hash():
    """Hash of the features.user file's content (in params: editing it reruns the audit, features and on)."""
    return stages.user_features_hash(config)


def hyperopt_worker_summaries(wildcards):
    """Worker summaries of one model's study (of one model x fold's under hyperopt.per_fold)."""
    return pipeline.hyperopt_worker_files(
        config, wildcards.model, wildcards.get("fold")
    )


def hyperopt_params(wildcards):
    """Best hyperparameters of the model and fold being trained (its own fold's study under hyperopt.per_fold)."""
    return pipeline.hyperopt_best_file(config, wildcards.model, wildcards.fold)


def fold_hyperopt_params(wildcards):
    """Best hyperparameters of every fold of a fold-batched train job, in fold order (one file unless
    hyperopt.per_fold)."""
    return [
        pipeline.hyperopt_best_file(config, wildcards.model, fold)
        for fold in FOLD_INDICES
    ]


def study_results_dir(wildcards):
    """The results directory whose hyperopt/{model}/ holds the study journal and locks (marketrl.settings.paths.STUDY_DIR).

    The journal is shared by every worker of a study, so it is no single job's output; clusters without a shared
    filesystem use an RDB URL in hyperopt.storage instead.
    """
    return paths.RESULTS


def seed_outputs(template):
    """One output per seed of a model x fold job ({model} and {fold} stay wildcards). Outputs cannot be input
    functions, so this is the config's seed list; the *_once rules take seed 0 for a deterministic model.
    """
    return expand(template, seed=pipeline.seed_indices(config), allow_missing=True)


def fold_seed_outputs(template):
    """One output per fold x seed of a fold-batched train job (fold-major; {model} stays a wildcard)."""
    return expand(
        template,
        fold=FOLD_INDICES,
        seed=pipeline.seed_indices(config),
        allow_missing=True,
    )


def fold_resume_files(wildcards):
    """The resumable checkpoint of every fold of a fold-batched train job (a batch of folds uses its first's)."""
    return [
        paths.RESUME.format(model=wildcards.model, fold=fold) for fold in FOLD_INDICES
    ]


def resume_file(wildcards):
    """The training job's resumable checkpoint: an undeclared side file (see marketrl/settings/paths.py)."""
    return paths.RESUME.format(model=wildcards.model, fold=wildcards.fold)


def run_seeds(wildcards):
    """The seed indices one train or evaluate job (one model x fold) runs: the one list every per-seed input
    and output of that job follows (seed 0 alone for a deterministic model: rules train_once, evaluate_once).
    """
    return pipeline.seed_indices(config, wildcards.model)


def export_outputs(template):
    """One export directory per seed of a model x fold job, as `seed_outputs`."""
    return [directory(path) for path in seed_outputs(template)]


def tensorboard_dirs(wildcards):
    """The TensorBoard run directory of every seed a train job runs: undeclared side output (see
    marketrl/settings/paths.py), emptied by the job at its start.
    """
    return [
        paths.TENSORBOARD.format(model=wildcards.model, fold=wildcards.fold, seed=seed)
        for seed in run_seeds(wildcards)
    ]


def fold_tensorboard_dirs(wildcards):
    """The TensorBoard run directory of every fold x seed of a fold-batched train job (fold-major)."""
    return [
        paths.TENSORBOARD.format(model=wildcards.model, fold=fold, seed=seed)
        for fold in FOLD_INDICES
        for seed in run_seeds(wildcards)
    ]


def seed_models(wildcards):
    """The models an evaluation job scores: every seed's model of its model x fold."""
    return [
        paths.MODEL.format(model=wildcards.model, fold=wildcards.fold, seed=seed)
        for seed in run_seeds(wildcards)
    ]


def record_metrics(wildcards):
    """The walk-forward record an evaluation job's gate reads: every seed's metrics.json of the model's earlier
    folds (none on the first fold, or without training.record_min_t)."""
    return pipeline.record_metrics_files(config, wildcards.model, int(wildcards.fold))


def predict_record_metrics(wildcards):
    """The walk-forward record of the fold predict applies: the same gate its evaluation applied."""
    return pipeline.record_metrics_files(
        config, wildcards.model, pipeline.predict_fold(config)
    )


def predict_feature_inputs(wildcards):
    """A new file of predict.files, plus the files that start before it (pipeline.predict_context) as lookback
    context and its days' quote files (pipeline.predict_quote_inputs), as feature_inputs gives them.
    """
    try:
        inputs = {"src": pipeline.predict_files(config)[wildcards.stem]}
        context = pipeline.predict_context(config, wildcards.stem)
        # data.quotes: the new file's days' quote files, paired as a training file's are
        quotes = pipeline.predict_quote_inputs(config, wildcards.stem)
    except KeyError:
        raise ValueError(
            f"{wildcards.stem}: not a file of predict.files ({config['predict']['files']!r})"
        ) from None
    except ConfigError as err:
        print(f"marketrl config error: {err}", file=sys.stderr)
        sys.exit(1)
    if context:
        inputs["context"] = context
    if quotes:
        inputs["quotes"] = quotes
    if config["features"][
        "user"
    ]:  # the same audited user features as the training tables
        inputs["audit"] = paths.USER_FEATURES_AUDIT
    return inputs


def predict_feature_files(wildcards):
    """The one file of a predict_features job, as feature_batch_files gives a batch's files (its days' quotes
    included)."""
    inputs = predict_feature_inputs(wildcards)
    return [
        {
            "dst": paths.PREDICT_FEATURES.format(stem=wildcards.stem),
            "src": inputs["src"],
            "context": inputs.get("context", []),
            "quotes": inputs.get("quotes", []),
        }
    ]


def predict_models(wildcards):
    """Every seed's checkpoint of the model a predict job applies, in the fold predict.fold names."""
    return pipeline.predict_model_files(config, wildcards.model)
