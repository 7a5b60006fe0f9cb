"""What every Snakemake job script shares: logging into the rule's log file, thread limits, one-line errors."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextmanager
def job_context(
    log_path: str | os.PathLike[str], threads: int = 1, uses_torch: bool = False
) -> Iterator[None]:
    """Send logging and warnings to `log_path`, cap math threads at `threads`, and log a failure on one line."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_path, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "POLARS_MAX_THREADS"):
        os.environ.setdefault(var, str(threads))
    if uses_torch:
        import torch

        # On small CPUs more torch threads than the job's share slows small-MLP training down sharply.
        torch.set_num_threads(max(1, threads))
    try:
        yield
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}".splitlines()[0]
        logging.getLogger("marketrl").error(message)
        print(f"marketrl error: {message}", file=sys.stderr)
        raise
    finally:
        root.removeHandler(handler)
        handler.close()
