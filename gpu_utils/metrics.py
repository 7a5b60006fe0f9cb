"""Per-step training statistics kept on the device, read back and checked for NaN/inf in ONE transfer a window.

Every training loop (reinforcement learning or supervised) uses `DeviceMetrics` the same way:

    metrics = DeviceMetrics(["loss", "grad_norm"], device, watched=("loss",), capacity=check_every)
    for step in range(1, n + 1):
        ...
        metrics.record([loss.detach(), grad_norm])      # no host sync
        if step % check_every == 0:
            window = metrics.read(step)                # the loop's one device->host copy; raises on NaN/inf

A non-finite value anywhere in a window makes that column's sum non-finite, so checking the sums of the
``watched`` columns is the NaN guard, sharing the statistics' read instead of adding a second one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["DeviceMetrics", "NonFiniteError"]


class NonFiniteError(RuntimeError):
    """A watched statistic held NaN or inf somewhere in the last window of steps."""


class DeviceMetrics:
    """Scalar statistics on the device: one row per step, reduced and read back once per window.

    * ``record(values)`` writes one row of 0-dim tensors (one per name in ``columns``) into a preallocated device
      buffer with a single ``torch.stack(..., out=row)``; a full buffer (``capacity`` rows) is folded into running
      sum/min/max accumulators on the device, so any window length works.
    * ``counter(name)`` is a device vector of ``counter_width`` running sums the caller updates in place (e.g. one
      slot per parallel worker); it is summed when read.

    ``read(step)`` copies everything with one ``tolist()``, resets, and returns ``{name: mean over the window's
    rows, name_min, name_max, counter: sum, "count": rows}``; it raises `NonFiniteError` naming the ``watched``
    columns that saw NaN/inf and the window of steps. ``state_dict`` holds the pending window, for resuming.
    """

    def __init__(
        self,
        columns: Sequence[str],
        device: torch.device | str,
        *,
        counters: Sequence[str] = (),
        watched: Sequence[str] = (),
        capacity: int = 128,
        counter_width: int = 1,
    ) -> None:
        unknown = [name for name in watched if name not in columns]
        if unknown:
            raise ValueError(f"watched names {unknown} are not among the columns {list(columns)}")
        self.columns = list(columns)
        self.counters = list(counters)
        self.watched = list(watched)
        self.device = torch.device(device)
        self.host_reads = 0
        self.window_start = 1
        self.pending = 0  # rows recorded since the last read (a host count: reading it costs nothing)
        width = len(self.columns)
        self._rows = torch.zeros(max(1, int(capacity)), width, dtype=torch.float32, device=self.device)
        self._next_row = 0
        self._folded = self._empty_fold()
        self._counts = torch.zeros(len(self.counters), counter_width, dtype=torch.float32, device=self.device)

    def _empty_fold(self) -> torch.Tensor:
        width = len(self.columns)
        return torch.tensor([[0.0] * width, [math.inf] * width, [-math.inf] * width], device=self.device)

    def record(self, values: Sequence[torch.Tensor]) -> None:
        """Write one row of 0-dim float32 tensors (in ``columns`` order); no host sync."""
        if self._next_row == self._rows.shape[0]:
            self._folded = self._reduced()
            self._next_row = 0
        torch.stack(list(values), out=self._rows[self._next_row])
        self._next_row += 1
        self.pending += 1

    def record_rows(self, rows: torch.Tensor) -> None:
        """Write k rows at once ([k, columns] float32, e.g. a captured loop's per-step rows); no host sync."""
        if rows.dim() != 2 or rows.shape[1] != len(self.columns):
            raise ValueError(f"rows must be [k, {len(self.columns)}], got {tuple(rows.shape)}")
        start = 0
        while start < rows.shape[0]:
            if self._next_row == self._rows.shape[0]:
                self._folded = self._reduced()
                self._next_row = 0
            take = min(rows.shape[0] - start, self._rows.shape[0] - self._next_row)
            self._rows[self._next_row : self._next_row + take].copy_(rows[start : start + take])
            self._next_row += take
            self.pending += take
            start += take

    def counter(self, name: str) -> torch.Tensor:
        """The running-sum vector of one counter (a view: update it in place, e.g. ``add_``)."""
        return self._counts[self.counters.index(name)]

    def counter_block(self, names: Sequence[str]) -> torch.Tensor:
        """The running-sum vectors of consecutive counters as one [len(names), counter_width] view (e.g. one row
        per seed of a batch, updated in one in-place op)."""
        first = self.counters.index(names[0])
        if self.counters[first : first + len(names)] != list(names):
            raise ValueError(f"counters {list(names)} are not consecutive in {self.counters}")
        return self._counts[first : first + len(names)]

    def _reduced(self) -> torch.Tensor:
        """[3, columns]: sum, min and max over the window (folded part and pending rows)."""
        rows = self._rows[: self._next_row]
        if rows.shape[0] == 0:
            return self._folded
        low, high = torch.aminmax(rows, dim=0)
        return torch.stack(
            [self._folded[0] + rows.sum(dim=0), self._folded[1].minimum(low), self._folded[2].maximum(high)]
        )

    def read(self, step: int) -> dict[str, float]:
        """One device->host copy of the window; reset; raise `NonFiniteError` on a non-finite watched column.

        ``step`` is the loop's step counter at the read (the error names the window of steps). Means are None
        for a window without rows.
        """
        packed = torch.cat([self._reduced().reshape(-1), self._counts.sum(dim=1)]).tolist()
        self.host_reads += 1
        width, count = len(self.columns), self.pending
        record: dict[str, Any] = {}
        for index, name in enumerate(self.columns):
            record[name] = packed[index] / count if count else None
            record[f"{name}_min"] = packed[width + index] if count else None
            record[f"{name}_max"] = packed[2 * width + index] if count else None
        record.update(zip(self.counters, packed[3 * width :], strict=True))
        record["count"] = count
        bad = [name for name in self.watched if count and not math.isfinite(packed[self.columns.index(name)])]
        first, self.window_start = self.window_start, step + 1
        self._next_row = self.pending = 0
        self._folded = self._empty_fold()
        self._counts.zero_()
        if bad:
            quoted = ", ".join(repr(name) for name in bad)
            raise NonFiniteError(f"non-finite {quoted} between steps {first} and {step}")
        return record

    def combine(self, reads: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Consecutive `read` records as one window (e.g. the per-epoch reads of one update): means weighted by
        ``count``, min of the minima, max of the maxima, counters summed."""
        total = sum(read["count"] for read in reads)
        combined: dict[str, Any] = {"count": total}
        for name in self.columns:
            seen = [read for read in reads if read["count"]]
            combined[name] = sum(read[name] * read["count"] for read in seen) / total if total else None
            combined[f"{name}_min"] = min((read[f"{name}_min"] for read in seen), default=None)
            combined[f"{name}_max"] = max((read[f"{name}_max"] for read in seen), default=None)
        for name in self.counters:
            combined[name] = sum(read[name] for read in reads)
        return combined

    def state_dict(self) -> dict[str, Any]:
        """The pending window (device tensors and counters), for resumable training checkpoints."""
        return {
            "rows": self._rows,
            "next_row": self._next_row,
            "pending": self.pending,
            "folded": self._folded,
            "counts": self._counts,
            "host_reads": self.host_reads,
            "window_start": self.window_start,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict` in place (counter views handed out by `counter` stay valid)."""
        self._rows.copy_(state["rows"])
        self._folded = state["folded"].to(self.device)
        self._counts.copy_(state["counts"])
        self._next_row = int(state["next_row"])
        self.pending = int(state["pending"])
        self.host_reads = int(state["host_reads"])
        self.window_start = int(state["window_start"])
