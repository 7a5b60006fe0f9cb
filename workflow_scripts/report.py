"""Snakemake script: the self-contained evaluation report."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.report import build_report
from marketrl.runtime.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads):
    build_report(
        eval_files=list(snakemake.input.evals),
        bar_files=list(snakemake.input.bars),
        hyperopt_files=list(snakemake.input.hyperopt),
        folds_path=snakemake.input.folds,
        train_logs=list(snakemake.input.train_logs),
        config=snakemake.params.config,
        out_path=snakemake.output.report,
        verdict_path=snakemake.output.verdict,
        manifest_path=snakemake.input.manifest,
    )
