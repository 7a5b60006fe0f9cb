"""Snakemake script: one job's synthetic worlds of the verdict's calibration, run end to end, as one chunk."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.calibration.worlds import run_job
from marketrl.runtime.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads, uses_torch=True):
    run_job(snakemake.params.config, int(snakemake.wildcards.job), snakemake.output[0])
