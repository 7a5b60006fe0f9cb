"""Snakemake script: the look-ahead audit of the features.user file, once, before any features job uses it."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.features.user_audit import write_user_audit
from marketrl.runtime.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads):
    config = snakemake.params.config
    write_user_audit(config["features"]["user"], config, snakemake.output[0])
