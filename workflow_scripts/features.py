"""Snakemake script: decode a batch of DBN.zst files (features.batch; one file for predict_features) into their
Parquet feature tables, each file with the files before it as lookback context."""

import logging
from pathlib import Path

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.features import FeatureJob, build_feature_batch, feature_options
from marketrl.features.user_audit import audited_user_features
from marketrl.runtime.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads):
    # rules/common.smk feature_batch_files: per file (time order) its table, source, context files (time order)
    # and data.quotes files; the inputs hold the same files, flattened.
    jobs = [
        FeatureJob(
            src=Path(entry["src"]),
            dst=Path(entry["dst"]),
            context_srcs=tuple(Path(p) for p in entry["context"]),
            quote_srcs=tuple(Path(p) for p in entry["quotes"]),
        )
        for entry in snakemake.params.files
    ]
    if [str(job.dst) for job in jobs] != list(snakemake.output):  # the rule and its params must agree
        raise RuntimeError(
            f"features job: params.files name {[str(j.dst) for j in jobs]}, outputs {snakemake.output}"
        )
    user_file = snakemake.params.config["features"]["user"]
    # features.user: the user_features_audit job's summary vouches for this content; anything else is audited here
    audit = snakemake.input.audit if "audit" in snakemake.input.keys() else None
    summaries = build_feature_batch(
        jobs,
        **feature_options(snakemake.params.config["data"]),
        fill_delay=snakemake.params.config["env"]["fill_delay"],
        user=audited_user_features(user_file, audit) if user_file else None,
    )
    for job, summary in zip(jobs, summaries, strict=True):
        logging.getLogger("marketrl.features").info("wrote %s: %s", job.dst, summary)
