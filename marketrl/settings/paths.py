"""Every path under results/: one template per file kind, shared by rules/*.smk, workflow_scripts and the library.

Templates use Snakemake's wildcard syntax ({model}, {fold}, {seed}, {worker}, {stem}, {job}); `format` fills them the same
way outside a rule. The library never derives one path from another: each job gets every path it reads or writes
from its rule (declared input, output or, for the undeclared side files below, params).

Undeclared side files (not rule outputs, on purpose):
- RESUME, a training job's resumable checkpoint (one per model x fold: its seeds train as one batch). Snakemake deletes a failed job's outputs, which would destroy the
  very state a rerun resumes from; the train job removes it once model.pt is written.
- STUDY_DIR, an Optuna study's journal and locks, shared by all hyperopt workers of one model (no single job
  owns it; with hyperopt.per_fold, by every fold's study of that model too) and absent when hyperopt.storage
  is an RDB URL.
- TENSORBOARD, a training job's TensorBoard event files (one run directory per seed): logs to watch a run live,
  holding wall times, so no output may depend on them; the train job empties each directory at its start.
"""

from __future__ import annotations

RESULTS = "results"

DEMO_DIR = "results/data/demo"
DATABENTO_DIR = "results/data/databento"
FEATURES = "results/features/{stem}.parquet"
FEATURE_MANIFEST = "results/features/manifest.json"
USER_FEATURES_AUDIT = "results/features/user_audit.json"  # the features.user audit (marketrl.features.user)
FOLDS = "results/folds.json"

HYPEROPT_WORKER = "results/hyperopt/{model}/worker_{worker}.json"
HYPEROPT_BEST = "results/hyperopt/{model}.json"
# hyperopt.per_fold (nested tuning): one study per model x fold; its studies share the model's storage (STUDY_DIR)
HYPEROPT_FOLD_WORKER = "results/hyperopt/{model}/fold_{fold}/worker_{worker}.json"
HYPEROPT_FOLD_BEST = "results/hyperopt/{model}/fold_{fold}.json"
STUDY_SUBDIR = "hyperopt/{model}"  # under a results directory; the library's tests use their own
STUDY_DIR = f"{RESULTS}/{STUDY_SUBDIR}"

_RUN = "{model}/fold_{fold}/seed_{seed}"
MODEL = f"results/models/{_RUN}/model.pt"
TRAIN_LOG = f"results/models/{_RUN}/train_log.json"
# one per model x fold: the seeds of a model x fold train (and resume) as one batch
RESUME = "results/models/{model}/fold_{fold}/resume.pt"
# TensorBoard: `tensorboard --logdir results/tensorboard` (make tensorboard) shows every model x fold x seed
TENSORBOARD_DIR = "results/tensorboard"
TENSORBOARD = f"{TENSORBOARD_DIR}/{_RUN}"
EVAL_METRICS = f"results/eval/{_RUN}/metrics.json"
EVAL_BARS = f"results/eval/{_RUN}/bars.parquet"
BASELINE_METRICS = "results/eval/baselines/fold_{fold}/metrics.json"
BASELINE_BARS = "results/eval/baselines/fold_{fold}/bars.parquet"

REPORT = "results/eval_report.html"
# The report's verdict, machine-readable: which models beat every baseline (predict's default models).
VERDICT = "results/verdict.json"

# Trained models applied to new DBN files (predict.files; not part of `all`, docs/PREDICT.md): each new file's
# feature table (shared by every model), then one table of per-bar positions per model x file.
PREDICT_FEATURES = "results/predict/features/{stem}.parquet"
PREDICT = "results/predict/{model}/{stem}.parquet"

# Exported models (not part of `all`): one directory per seed, TorchScript / ONNX / LightGBM file + export.json.
EXPORT_DIR = f"results/export/{_RUN}"

# The verdict's calibration (not part of `all`): one chunk of worlds per job, then the summary.
CALIBRATION_CHUNK = "results/calibration/chunks/job_{job}.json"
CALIBRATION_JSON = "results/calibration/calibration.json"
CALIBRATION_HTML = "results/calibration/calibration.html"


def log(name: str) -> str:
    """A rule's log file; `name` may hold wildcards, e.g. log("train/{model}/fold_{fold}/seed_{seed}")."""
    return f"results/logs/{name}.log"


def benchmark(name: str) -> str:
    """A rule's benchmark table, named like its log."""
    return f"results/benchmarks/{name}.tsv"
