"""Put this checkout first on sys.path, so job scripts import its marketrl even inside a `--sdm conda` env, and
cap the native thread pools at the rule's `threads:` before any library starts one.

Snakemake appends the script's own directory to sys.path, which is how job scripts find this module. It is every
job script's first import: polars sizes its pool from POLARS_MAX_THREADS when it is imported, so
marketrl.runtime.jobs.job_context, which sets the same variables, would be too late for it.
"""

import sys
from pathlib import Path

import __main__

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from marketrl.runtime.jobs import cap_thread_pools  # noqa: E402  (imports neither polars nor numpy)

# the job's `snakemake` object, which Snakemake's preamble defines in the script before its first line
cap_thread_pools(getattr(getattr(__main__, "snakemake", None), "threads", None))
