"""Snakemake script: the study's best parameters and every trial's value, as JSON."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.runtime.jobs import job_context
from marketrl.training.hyperopt import write_study_summary

FOLD = snakemake.wildcards.get("fold")  # set under hyperopt.per_fold: the fold's own study

with job_context(snakemake.log[0], snakemake.threads):
    write_study_summary(
        model=snakemake.wildcards.model,
        worker_summaries=list(snakemake.input.workers),
        folds_path=snakemake.input.folds,
        config=snakemake.params.config,
        out_path=snakemake.output[0],
        results_dir=snakemake.params.results_dir,
        fold=None if FOLD is None else int(FOLD),
    )
