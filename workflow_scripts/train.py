"""Snakemake script: train one algorithm on one fold with one seed."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.runtime.jobs import job_context
from marketrl.training.train import train_job

with job_context(snakemake.log[0], snakemake.threads, uses_torch=True):
    train_job(
        algo=snakemake.wildcards.algo,
        fold=int(snakemake.wildcards.fold),
        seed_index=int(snakemake.wildcards.seed),
        manifest_path=snakemake.input.manifest,
        folds_path=snakemake.input.folds,
        hparams_path=snakemake.input.hparams,
        config=snakemake.params.config,
        model_path=snakemake.output.model,
        log_path=snakemake.output.log_json,
        resume_path=snakemake.params.resume,
    )
