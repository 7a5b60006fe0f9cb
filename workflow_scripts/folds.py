"""Snakemake script: the walk-forward fold plan that every later job reads."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.runtime.jobs import job_context
from marketrl.splits.folds import write_fold_plan

with job_context(snakemake.log[0], snakemake.threads):
    write_fold_plan(list(snakemake.input), snakemake.params.config["folds"], snakemake.output[0])
