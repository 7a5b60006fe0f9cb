"""Snakemake script: the walk-forward fold plan that every later job reads."""

from marketrl.folds import write_fold_plan
from marketrl.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads):
    write_fold_plan(list(snakemake.input), snakemake.params.folds, snakemake.output[0])
