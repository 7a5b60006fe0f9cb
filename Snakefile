# marketrl: Databento DBN.zst -> features -> walk-forward folds -> hyperopt -> DQN/PPO per fold and seed -> report.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config.yaml"


validate(config, "schemas/config.schema.yaml")


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/features.smk"
include: "rules/folds.smk"
include: "rules/hyperopt.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"
include: "rules/report.smk"


rule all:
    input:
        "results/eval_report.html",
