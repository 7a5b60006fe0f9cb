"""Snakemake script: the verdict's calibration summary (false-positive rate, power) as JSON and HTML."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.calibration.worlds import summarize_job
from marketrl.runtime.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads):
    summarize_job(
        list(snakemake.input),
        snakemake.params.config,
        snakemake.output.json,
        snakemake.output.html,
        command=f"snakemake {snakemake.output.html}",
    )
