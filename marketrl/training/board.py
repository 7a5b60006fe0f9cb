"""TensorBoard event files of a training job, to watch it live (`make tensorboard`; docs/OUTPUTS.md).

One run directory per seed (`marketrl.settings.paths.TENSORBOARD`: results/tensorboard/{model}/fold_{fold}/seed_{seed}),
emptied when the job starts so that a rerun never appends to stale events. Everything is written from records the
job already has, so the board adds no host sync to a training loop:

- live, at each validation (`on_score`, via `ProgressLog`): ``validation/sharpe`` and ``progress/steps_per_s`` (the
  job's wall rate, as its log prints it);
- live, each statistics record a training loop hands to ``on_log`` for one seed (every ``check_every`` steps; an
  agent's batch record split per seed by the zoo): ``train/<statistic>``;
- when the run ends: the statistics not written live (a resumed run's curves start at the resume, its
  train_log.json has the whole history),
  ``perf/steps_per_s`` (the trainer's own rate) and the batch's counters ``counters/host_syncs`` and
  ``counters/nan_checks`` (statistics reads, each one the NaN/inf check).

Event files hold wall times: they are logs, never outputs, and nothing hashed or compared reads them.
The writer (`torch.utils.tensorboard`, hence the tensorboard package) is imported lazily, only by a job that trains
(about 0.2 s of CPU, measured with ``python -X importtime``).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["STEP_KEYS", "TrainingBoard", "scalars"]

#: record keys that are the x axis or bookkeeping, not curves
STEP_KEYS = frozenset({"step", "env_steps", "grad_steps", "update", "count", "seed", "val_sharpe"})
FLUSH_SECS = 10  # how stale the board may be while a job runs (TensorBoard reloads every 5 s by default)


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a statistics record, keyed by their TensorBoard tag (``train/<key>``)."""
    return {
        f"train/{key}": float(value)
        for key, value in record.items()
        if key not in STEP_KEYS
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


class TrainingBoard:
    """One `SummaryWriter` per seed of a training job; use as a context manager (closing flushes the files).

    ``run_dirs[i]`` is the run directory of ``seeds[i]`` (the training seed, which a forecaster's statistics
    records carry); each is removed and recreated here.
    """

    def __init__(self, run_dirs: Sequence[str | Path], seeds: Sequence[int]) -> None:
        from torch.utils.tensorboard import SummaryWriter  # lazy: tensorboard only in jobs that train

        if len(run_dirs) != len(seeds):
            raise ValueError(f"TrainingBoard: {len(run_dirs)} run directories for {len(seeds)} seeds")
        self.seeds = [int(seed) for seed in seeds]
        self.writers = []
        for run_dir in run_dirs:
            shutil.rmtree(run_dir, ignore_errors=True)  # a rerun must not append to the last run's events
            self.writers.append(SummaryWriter(log_dir=str(run_dir), flush_secs=FLUSH_SECS))
        self.live_tags: list[set[str]] = [set() for _ in self.writers]  # seed i's tags written as they came

    def __enter__(self) -> TrainingBoard:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def _write(self, position: int, step: int, values: Mapping[str, float]) -> None:
        writer = self.writers[position]
        for tag, value in values.items():
            writer.add_scalar(tag, value, global_step=int(step))

    def validation(
        self, position: int, step: int, scores: Sequence[float | None], steps_per_s: float
    ) -> None:
        """Validation Sharpe of seeds ``position``, ``position + 1``, ... at ``step`` (None: a seed not validated
        at this step), with the job's wall rate."""
        for offset, score in enumerate(scores):
            if score is None:
                continue
            values = {"validation/sharpe": score, "progress/steps_per_s": steps_per_s}
            self._write(position + offset, step, {k: v for k, v in values.items() if math.isfinite(v)})

    def record(self, record: Mapping[str, Any]) -> None:
        """One statistics record of one seed (``on_log``); a record without a known ``seed`` waits
        for `finish` (its history holds it)."""
        seed = record.get("seed")
        if seed not in self.seeds or "step" not in record:
            return
        position = self.seeds.index(seed)
        values = scalars(record)
        self.live_tags[position].update(values)
        self._write(position, record["step"], values)

    def finish(self, train_logs: Sequence[Mapping[str, Any]]) -> None:
        """The end of the run, from each seed's train_log.json record (``history``, ``total_steps``,
        ``steps_per_s``, the counters): the statistics not written live, then the run's totals."""
        for position, train_log in enumerate(train_logs):
            live = self.live_tags[position]
            for record in train_log.get("history", []):
                values = {tag: value for tag, value in scalars(record).items() if tag not in live}
                self._write(position, record["step"], values)
            host_syncs = train_log.get("host_syncs", train_log.get("statistics_reads"))
            nan_checks = train_log.get("nan_checks", train_log.get("statistics_reads"))
            totals = {
                "perf/steps_per_s": train_log.get("steps_per_s"),
                "counters/host_syncs": host_syncs,
                "counters/nan_checks": nan_checks,
            }
            self._write(
                position,
                train_log["total_steps"],
                {tag: float(v) for tag, v in totals.items() if v is not None and math.isfinite(v)},
            )

    def close(self) -> None:
        """Flush and close every writer."""
        for writer in self.writers:
            writer.close()
