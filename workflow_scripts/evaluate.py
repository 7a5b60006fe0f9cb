"""Snakemake script: evaluate every seed of one trained model x fold on the fold's test days."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.evaluation.evaluate import evaluate_job
from marketrl.runtime.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads, uses_torch=True):
    evaluate_job(
        model=snakemake.wildcards.model,
        fold=int(snakemake.wildcards.fold),
        seed_indices=list(snakemake.params.seeds),
        manifest_path=snakemake.input.manifest,
        folds_path=snakemake.input.folds,
        model_paths=list(snakemake.input.models),
        config=snakemake.params.config,
        metrics_paths=list(snakemake.output.metrics),
        bars_paths=list(snakemake.output.bars),
        record_paths=list(snakemake.input.record),
    )
