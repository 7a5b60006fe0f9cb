"""Snakemake script: export every seed of one trained model x fold (TorchScript / ONNX / LightGBM + export.json)."""

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.runtime.jobs import job_context
from marketrl.training.export import export_job

with job_context(snakemake.log[0], snakemake.threads, uses_torch=True):
    export_job(
        model=snakemake.wildcards.model,
        model_paths=list(snakemake.input.models),
        config=snakemake.params.config,
        out_dirs=list(snakemake.output.dirs),
    )
