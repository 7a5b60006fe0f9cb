"""What every Snakemake job script shares: logging into the rule's log file, thread limits, one-line errors."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from marketrl.runtime.errors import is_known_error, one_line

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextmanager
def job_context(
    log_path: str | os.PathLike[str], threads: int = 1, uses_torch: bool = False
) -> Iterator[None]:
    """Send logging and warnings to `log_path`, cap math threads at `threads`, and report a failure on one line.

    A failing job logs the traceback to `log_path` and prints ``marketrl error: <Type>: <message>`` to stderr. A
    known data or config error (`marketrl.runtime.errors.KNOWN_ERRORS`) then exits with status 1 and no traceback
    on the console; any other exception (a bug) is re-raised, so its traceback reaches the console too.
    """
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
        message = one_line(exc)
        logging.getLogger("marketrl").error(message, exc_info=True)
        print(f"marketrl error: {message}", file=sys.stderr)
        if is_known_error(exc):
            raise SystemExit(1) from None
        raise
    finally:
        root.removeHandler(handler)
        handler.close()
