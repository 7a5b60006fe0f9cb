"""Snakemake script: train one model on one fold with all its seeds (one batch where the model can)."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.runtime.jobs import job_context
from marketrl.training.train import train_job

with job_context(snakemake.log[0], snakemake.threads, uses_torch=True):
    train_job(
        model=snakemake.wildcards.model,
        fold=int(snakemake.wildcards.fold),
        seed_indices=list(snakemake.params.seeds),
        manifest_path=snakemake.input.manifest,
        folds_path=snakemake.input.folds,
        hparams_path=snakemake.input.hparams,
        config=snakemake.params.config,
        model_paths=list(snakemake.output.models),
        log_paths=list(snakemake.output.logs),
        resume_path=snakemake.params.resume,
        tensorboard_dirs=list(snakemake.params.tensorboard),
    )
