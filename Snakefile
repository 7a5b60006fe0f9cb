# marketrl: Databento DBN.zst -> features -> walk-forward folds -> hyperopt -> DQN/PPO per fold and seed -> report.
# The config is validated in rules/common.smk (one line naming the key on an error), against
# schemas/config.schema.yaml; every results/ path comes from marketrl/settings/paths.py.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/features.smk"
include: "rules/folds.smk"
include: "rules/hyperopt.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"
include: "rules/report.smk"
include: "rules/calibration.smk"
include: "rules/predict.smk"
include: "rules/export.smk"


rule all:
    input:
        paths.REPORT,


# Trained models applied to new files (predict.files; docs/PREDICT.md): not part of `all`.
rule predict_all:
    input:
        PREDICT_OUTPUTS,


# Every model, fold and seed of the config exported (make export; not part of `all`).
rule export_all:
    input:
        pipeline.export_dirs(config),
