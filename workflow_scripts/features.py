"""Snakemake script: decode one DBN.zst file once into its Parquet feature table (earlier files as context)."""

import logging
from pathlib import Path

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.features import build_feature_file, feature_options
from marketrl.features.user_audit import audited_user_features
from marketrl.runtime.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads):
    # rules/common.smk feature_inputs gives "context" as a list (the files before, in time order), or not at all.
    context = list(snakemake.input.context) if "context" in snakemake.input.keys() else []
    # data.quotes: the quote files of the file's days (rules/common.smk feature_inputs), or none
    quotes = list(snakemake.input.quotes) if "quotes" in snakemake.input.keys() else []
    user_file = snakemake.params.config["features"]["user"]
    # features.user: the user_features_audit job's summary vouches for this content; anything else is audited here
    audit = snakemake.input.audit if "audit" in snakemake.input.keys() else None
    summary = build_feature_file(
        Path(snakemake.input.src),
        Path(snakemake.output[0]),
        **feature_options(snakemake.params.config["data"]),
        context_srcs=[Path(p) for p in context],
        quote_srcs=[Path(p) for p in quotes],
        user=audited_user_features(user_file, audit) if user_file else None,
    )
    logging.getLogger("marketrl.features").info("wrote %s: %s", snakemake.output[0], summary)
