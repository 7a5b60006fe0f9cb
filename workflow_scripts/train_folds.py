"""Snakemake script: train one model on every fold with all its seeds (training.batch_folds)."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.runtime.jobs import job_context
from marketrl.training.train import train_folds_job

with job_context(snakemake.log[0], snakemake.threads, uses_torch=True):
    train_folds_job(
        model=snakemake.wildcards.model,
        folds=list(snakemake.params.folds),
        seed_indices=list(snakemake.params.seeds),
        manifest_path=snakemake.input.manifest,
        folds_path=snakemake.input.folds,
        hparams_paths=list(snakemake.input.hparams),
        config=snakemake.params.config,
        model_paths=list(snakemake.output.models),
        log_paths=list(snakemake.output.logs),
        resume_paths=list(snakemake.params.resume),
        tensorboard_dirs=list(snakemake.params.tensorboard),
    )
