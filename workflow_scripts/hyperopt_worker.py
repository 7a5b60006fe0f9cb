"""Snakemake script: one worker of a model's Optuna study."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.runtime.jobs import job_context
from marketrl.training.hyperopt import run_worker

FOLD = snakemake.wildcards.get("fold")  # set under hyperopt.per_fold: the fold's own study

with job_context(snakemake.log[0], snakemake.threads, uses_torch=True):
    run_worker(
        model=snakemake.wildcards.model,
        worker=int(snakemake.wildcards.worker),
        manifest_path=snakemake.input.manifest,
        folds_path=snakemake.input.folds,
        config=snakemake.params.config,
        out_path=snakemake.output[0],
        results_dir=snakemake.params.results_dir,
        fold=None if FOLD is None else int(FOLD),
        code=snakemake.params.code,
    )
