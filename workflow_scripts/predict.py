"""Snakemake script: apply every seed of one trained model to one new file's feature table."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.evaluation.predict import predict_job
from marketrl.runtime.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads, uses_torch=True):
    predict_job(
        model=snakemake.wildcards.model,
        seed_indices=list(snakemake.params.seeds),
        features_path=snakemake.input.features,
        manifest_path=snakemake.input.manifest,
        folds_path=snakemake.input.folds,
        model_paths=list(snakemake.input.models),
        config=snakemake.params.config,
        out_path=snakemake.output[0],
        record_paths=list(snakemake.input.record),
    )
