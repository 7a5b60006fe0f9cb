"""Snakemake script: one manifest (paths, sha256, rows, days) of every feature table for the fan-out jobs."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.runtime.jobs import job_context
from marketrl.splits.datasets import write_feature_manifest

with job_context(snakemake.log[0], snakemake.threads):
    write_feature_manifest(list(snakemake.input), snakemake.output[0])
