"""Snakemake script: write the synthetic demo DBN.zst files (ohlcv-1m and bbo-1m per UTC day, and the definition
file)."""

from pathlib import Path

import _checkout  # noqa: F401  (marketrl from this checkout, also inside --sdm conda envs)

from marketrl.data.demo import demo_definition_path, generate_demo_files
from marketrl.data.file_order import DEMO_QUOTES_DIR
from marketrl.runtime.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads):
    out_dir = Path(snakemake.output[0]).parent
    demo = snakemake.params.config["data"]["demo"]
    written = generate_demo_files(
        out_dir, demo["start"], demo["days"], demo["seed"], edge=demo["edge"], edge_kind=demo["edge_kind"]
    )
    # the quote file of each bar file's day (marketrl.data.file_order: DEMO_QUOTES_DIR, demo_quote_file_name)
    written += [p.parent / DEMO_QUOTES_DIR / p.name.replace(".ohlcv-1m.", ".bbo-1m.") for p in written]
    written.append(demo_definition_path(out_dir, demo["start"], demo["days"]))
    expected = {Path(p).resolve() for p in snakemake.output}
    if {p.resolve() for p in written} != expected:
        raise RuntimeError("demo_data: generated files differ from the rule's declared outputs")
