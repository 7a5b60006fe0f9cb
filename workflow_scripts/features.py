"""Snakemake script: decode one DBN.zst file once into its Parquet feature table."""

import logging
from pathlib import Path

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.features import build_feature_file, feature_options
from marketrl.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads):
    prev = Path(snakemake.input.prev) if "prev" in snakemake.input.keys() else None
    summary = build_feature_file(
        Path(snakemake.input.src),
        Path(snakemake.output[0]),
        **feature_options(snakemake.params.config["data"]),
        prev_src=prev,
    )
    logging.getLogger("marketrl.features").info("wrote %s: %s", snakemake.output[0], summary)
