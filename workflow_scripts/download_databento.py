"""Snakemake script: optional download of the configured data with databento.Historical."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.data.download import download_days
from marketrl.runtime.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads):
    download_days(snakemake.params.config["data"]["databento"], list(snakemake.output))
