"""Snakemake script: baselines (buy-and-hold, flat, random, momentum) on one fold's test days."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.evaluation.evaluate import baselines_job
from marketrl.runtime.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads, uses_torch=True):
    baselines_job(
        fold=int(snakemake.wildcards.fold),
        manifest_path=snakemake.input.manifest,
        folds_path=snakemake.input.folds,
        config=snakemake.params.config,
        metrics_path=snakemake.output.metrics,
        bars_path=snakemake.output.bars,
    )
