"""Snakemake script: evaluate one trained model on its fold's test days."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.evaluation.evaluate import evaluate_job
from marketrl.runtime.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads, uses_torch=True):
    evaluate_job(
        algo=snakemake.wildcards.algo,
        fold=int(snakemake.wildcards.fold),
        seed_index=int(snakemake.wildcards.seed),
        manifest_path=snakemake.input.manifest,
        folds_path=snakemake.input.folds,
        model_path=snakemake.input.model,
        config=snakemake.params.config,
        metrics_path=snakemake.output.metrics,
        bars_path=snakemake.output.bars,
    )
