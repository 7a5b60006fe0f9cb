"""Benchmark: hyperopt throughput of 1, 2 and 4 worker processes on one PostgreSQL study, with tiny trials.

Each worker runs the real claim loop (`work_on_study` with `PostgresClaims`: advisory lock, heartbeat rows, per-slot
reseeded TPE sampler) on an objective that only draws three parameters, so the numbers are the claim and storage
overhead a real trial pays once. Workers load the study, meet at a barrier, then run until the study holds
--trials trials. Prints trials per minute (wall time from the barrier to the last worker's end) and, per claim, the time the
study's lock is held (recover + claim + first heartbeat + commit: the serialized part) and waited for, and per
trial the rest of the loop (parameter sampling, tell, heartbeat clean-up), summed over workers.

    .venv/bin/python bench/speed/hyperopt_scale.py [--trials 60] [--workers 1 2 4] [--storage postgresql://...]
    .venv/bin/python bench/speed/hyperopt_scale.py --quick      # 6 trials, 1 and 2 workers: a sanity run
    .venv/bin/python bench/speed/hyperopt_scale.py --if-available   # SKIPPED (exit 0) without PostgreSQL

Without --storage it starts a throwaway cluster (tests/postgres/cluster.py; needs PostgreSQL and psycopg2, the
`postgres` extra) and makes one database per worker count.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: tests.postgres

from marketrl.settings.config import derive_seed, validate_config
from marketrl.training.hyperopt import load_study
from marketrl.training.study_storage import PostgresClaims, work_on_study
from tests.postgres import cluster as pg
from tests.postgres.pg_worker import objective  # the tests' tiny trial, so bench and tests time the same work


class TimedClaims(PostgresClaims):
    """PostgresClaims that records, per claim, the wait for the study's lock and how long it is held."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.wait_s: list[float] = []
        self.hold_s: list[float] = []

    @contextmanager
    def lock(self, study: optuna.Study) -> Iterator[None]:
        started = time.perf_counter()
        with super().lock(study):
            acquired = time.perf_counter()
            yield
        self.wait_s.append(acquired - started)
        self.hold_s.append(time.perf_counter() - acquired)  # recover + claim + first heartbeat + commit


def worker(url: str, n_trials: int, workers: int, barrier, results) -> None:
    config = validate_config(
        {"seed": 5, "hyperopt": {"n_trials": n_trials, "workers": workers, "storage": url}}
    )
    study = load_study(config, "dqn", 0, "unused")
    claims = TimedClaims(url, heartbeat_seconds=10.0, grace_seconds=120.0)
    barrier.wait()
    started = time.perf_counter()
    ran = work_on_study(
        study, "dqn", n_trials, objective, seed=derive_seed(config["seed"], "hyperopt", "dqn"), claims=claims
    )
    results.put((started, time.perf_counter(), len(ran), claims.wait_s, claims.hold_s))


def measure(url: str, n_trials: int, workers: int) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(workers)
    results = context.Queue()
    procs = [
        context.Process(target=worker, args=(url, n_trials, workers, barrier, results))
        for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    rows = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(60)
        if proc.exitcode != 0:
            raise SystemExit(f"a worker failed (exit code {proc.exitcode})")
    wall = max(row[1] for row in rows) - min(row[0] for row in rows)
    ran = sum(row[2] for row in rows)
    if ran != n_trials:
        raise SystemExit(f"{workers} workers ran {ran} trials, expected {n_trials}")
    wait_s = [s for row in rows for s in row[3]]
    hold_s = [s for row in rows for s in row[4]]
    busy = sum(row[1] - row[0] for row in rows)
    return {
        "workers": workers,
        "trials_per_min": 60.0 * n_trials / wall,
        "hold_ms": 1000.0 * statistics.median(hold_s),
        "wait_ms": 1000.0 * statistics.median(wait_s),
        "rest_ms": 1000.0 * (busy - sum(hold_s) - sum(wait_s)) / n_trials,
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=None, help="trials per study (default 60; quick 6)")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=None, help="worker counts (default 1 2 4; quick 1 2)"
    )
    parser.add_argument("--storage", default="", help="a PostgreSQL URL; one study per run is created there")
    parser.add_argument("--quick", action="store_true", help="6 trials, 1 and 2 workers: a sanity run")
    parser.add_argument(
        "--if-available", action="store_true", help="print SKIPPED and exit 0 where PostgreSQL cannot start"
    )
    args = parser.parse_args()
    args.trials = args.trials or (6 if args.quick else 60)
    args.workers = args.workers or ([1, 2] if args.quick else [1, 2, 4])
    directory = None
    if args.storage:
        urls = {w: args.storage for w in args.workers}
        if len(args.workers) > 1:
            raise SystemExit("--storage holds one study: give one --workers value per run")
    else:
        reason = pg.unavailable()
        if reason and args.if_available:
            print(f"bench/speed/hyperopt_scale.py: SKIPPED (cannot start PostgreSQL: {reason})")
            return
        if reason:
            raise SystemExit(f"cannot start PostgreSQL: {reason}")
        directory = Path(tempfile.mkdtemp(prefix="marketrl-pg-bench-"))
        cluster = pg.start(directory)
        urls = {w: cluster.create_database(f"bench_{w}") for w in args.workers}
    try:
        print(f"{args.trials} tiny trials per study; PostgreSQL claims (advisory lock + heartbeat rows)")
        print(
            "workers | trials/min | lock held ms (median) | lock wait ms (median) | rest per trial ms | wall s"
        )
        for workers in args.workers:
            row = measure(urls[workers], args.trials, workers)
            print(
                f"{row['workers']:7d} | {row['trials_per_min']:10.0f} | {row['hold_ms']:21.1f} | "
                f"{row['wait_ms']:21.1f} | {row['rest_ms']:17.1f} | {row['wall_s']:6.1f}"
            )
    finally:
        if directory is not None:
            pg.stop(directory)
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
