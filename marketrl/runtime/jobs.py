"""What every Snakemake job script shares: logging into the rule's log file, thread limits, one-line errors."""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from marketrl.runtime.errors import is_known_error, one_line

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: the native thread pools a job caps at its `threads:` (polars reads its variable once, when it is imported)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "POLARS_MAX_THREADS")


def cap_thread_pools(threads: object) -> None:
    """Cap the native thread pools at `threads` where the environment does not set them already (a job script's
    first import calls it, workflow_scripts/_checkout.py); no-op unless `threads` is a positive int."""
    if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0:
        for var in THREAD_VARIABLES:
            os.environ.setdefault(var, str(threads))


def _seconds_since_start() -> float:
    """Wall seconds since this process started: on Linux from its start in clock ticks since boot (psutil's
    create_time adds the boot time, which the kernel gives in whole seconds: up to a second off)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, IndexError, ValueError, AttributeError):
        return time.time() - psutil.Process().create_time()


def job_cost() -> dict[str, float]:
    """This process's cost so far: wall seconds since it started, CPU seconds (user + system, its waited-for
    children included) and peak RSS in MB; exact, where Snakemake's benchmark samples CPU twice a second."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    return {
        "wall_s": _seconds_since_start(),
        "cpu_s": cpu,
        "max_rss_mb": max(own.ru_maxrss, children.ru_maxrss) / 1024,  # Linux: kB
    }


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
    cap_thread_pools(threads)
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
        cost = job_cost()
        logging.getLogger("marketrl").info(
            "job cost: %.2f s wall since the process started, %.2f CPU-s, peak RSS %.0f MB",
            cost["wall_s"],
            cost["cpu_s"],
            cost["max_rss_mb"],
        )
        root.removeHandler(handler)
        handler.close()
