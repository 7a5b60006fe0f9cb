"""Supervised rows of one split: forward-return targets inside a segment and lookback windows, on the device.

Row t of a `MarketData` is usable for training when
  * its target exists: t + horizon <= the last row of t's segment (a target never reaches across a segment end,
    hence never across another instrument or a missing weekday of data: `MarketData` segments split there), and
  * its window is full: t - window + 1 >= the first row of t's segment.
Rows without a full window are skipped, not padded: in training they are dropped, at prediction time they get
prediction 0, so the trading rule keeps them flat. A window is rows t-window+1..t of the same segment, oldest
first; it never reads a row after t.

Which rows qualify is host arithmetic on the segment bounds `MarketData` already keeps on the host, so building
the rows costs no device->host sync; targets and windows are gathered on the device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from marketrl.env import MarketData

__all__ = [
    "CPU_EVAL_PREDICT_CHUNK",
    "PREDICT_CHUNK",
    "ModelDataError",
    "SupervisedRows",
    "forward_returns",
    "full_window_rows",
    "predict_rows",
    "training_rows",
]

#: Rows per forward pass when predicting a whole split (bounds memory; host-side chunking, no syncs).
PREDICT_CHUNK = 8192
#: Evaluation's rows per forward on the CPU: DLinear's [rows, features, hidden] activations are ~100 MB at 8192
#: rows and predict a demo test split 3x slower than at 512 (the other models: within noise). The rows of a
#: forward can change a prediction's float32 rounding only (BLAS blocking); on the demo run every model's
#: predictions were bit-identical at both sizes (docs/PERFORMANCE.md, Evaluation)
CPU_EVAL_PREDICT_CHUNK = 512
#: Seeds `SupervisedRows.sample` with the row counts: the sample depends on the data's shape, not on a run's seed.
ROW_SAMPLE_SEED = 39


class ModelDataError(ValueError):
    """A split cannot train a model (no row with a full window and an in-segment target)."""


def _rows_between(firsts: np.ndarray, lasts: np.ndarray) -> np.ndarray:
    """All rows first..last (inclusive) of each segment whose range is non-empty, as host int64."""
    parts = [np.arange(first, last + 1) for first, last in zip(firsts, lasts, strict=True) if last >= first]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def full_window_rows(data: MarketData, window: int, horizon: int = 0) -> np.ndarray:
    """Rows with a full `window` inside their segment and, for horizon > 0, a target `horizon` bars ahead in it."""
    return _rows_between(data.segment_first + window - 1, data.segment_last - horizon)


def forward_returns(data: MarketData, horizon: int) -> torch.Tensor:
    """[T] float32 on the data's device: close_{t+horizon} / close_t - 1 where t+horizon is in t's segment, else 0
    (those rows are never training rows)."""
    rows = torch.arange(data.n_rows, device=data.device)
    ahead = (rows + horizon).clamp_(max=data.n_rows - 1)
    inside = (rows + horizon < data.n_rows) & (data.segment_id.index_select(0, ahead) == data.segment_id)
    ratio = data.close.index_select(0, ahead) / data.close - 1.0
    return torch.where(inside, ratio, torch.zeros_like(ratio)).to(torch.float32)


def gather_windows(features: torch.Tensor, rows: torch.Tensor, window: int) -> torch.Tensor:
    """[N, window, F]: feature rows t-window+1..t for each t in `rows` (callers pass full-window rows only)."""
    offsets = torch.arange(window - 1, -1, -1, device=rows.device)
    index = (rows[:, None] - offsets).reshape(-1)
    return features.index_select(0, index).view(rows.shape[0], window, features.shape[1])


@dataclass
class SupervisedRows:
    """One split's training rows (device int64 [N]), targets [T] and features [T, F] (views of the data)."""

    features: torch.Tensor
    target: torch.Tensor
    rows: torch.Tensor
    n_rows: int  # len(rows), a host integer
    window: int
    horizon: int

    @classmethod
    def build(
        cls,
        data: MarketData,
        window: int,
        horizon: int,
        within: tuple[int, int] | None = None,
        target: torch.Tensor | None = None,
    ) -> SupervisedRows:
        """Rows with a full window and an in-segment target (see the module docstring); with ``within``
        [start, stop), only those rows (one part of a stacked table, `marketrl.env.stack_market_data`).
        ``target``: the data's `forward_returns` when the caller already has them."""
        host_rows = full_window_rows(data, window, horizon)
        if within is not None:
            host_rows = host_rows[(host_rows >= within[0]) & (host_rows < within[1])]
        return cls(
            features=data.features,
            target=forward_returns(data, horizon) if target is None else target,
            rows=torch.as_tensor(host_rows, device=data.device),
            n_rows=int(host_rows.size),
            window=window,
            horizon=horizon,
        )

    def batch(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(windows [B, window, F], targets [B]) of these rows (drawn from `self.rows` on the device)."""
        return gather_windows(self.features, rows, self.window), self.target.index_select(0, rows)

    def sample(self, max_rows: int) -> SupervisedRows:
        """At most ``max_rows`` of these rows: a uniform sample without replacement, in time order, drawn from the
        row count alone (every seed and every model of a fold with the same window fits the same rows); all rows
        when there are no more than that. It bounds what a fit holds and costs once an expanding window grows
        (training.max_train_rows): the sample still spans the whole window."""
        if self.n_rows <= max_rows:
            return self
        generator = np.random.default_rng([ROW_SAMPLE_SEED, self.n_rows, max_rows])
        picked = np.sort(generator.choice(self.n_rows, size=max_rows, replace=False))
        rows = self.rows.index_select(0, torch.as_tensor(picked, device=self.rows.device))
        return dataclasses.replace(self, rows=rows, n_rows=max_rows)

    def chunks(self, size: int = PREDICT_CHUNK) -> list[torch.Tensor]:
        """`rows` in consecutive slices of at most `size` (slicing by host integers: no sync)."""
        return [self.rows[start : start + size] for start in range(0, self.n_rows, size)]


def training_rows(
    data: MarketData,
    window: int,
    horizon: int,
    max_rows: int | None = None,
    within: tuple[int, int] | None = None,
    target: torch.Tensor | None = None,
) -> SupervisedRows:
    """`SupervisedRows.build` (``within``, ``target`` as there), refusing a split with no usable row in one line;
    with ``max_rows``, at most that many of them (`SupervisedRows.sample`)."""
    rows = SupervisedRows.build(data, window, horizon, within, target)
    if rows.n_rows == 0:
        where = "train_data" if within is None else f"train_data rows [{within[0]}, {within[1]})"
        raise ModelDataError(
            f"{where}: no row has a full window of {window} rows and a target {horizon} bars ahead inside "
            "its segment"
        )
    return rows if max_rows is None else rows.sample(max_rows)


def predict_rows(
    predictor: Callable[[torch.Tensor], torch.Tensor],
    data: MarketData,
    window: int,
    chunk: int = PREDICT_CHUNK,
) -> torch.Tensor:
    """Predictions [T] float32 for every row with a full window (0 elsewhere), `chunk` rows per forward pass."""
    host_rows = full_window_rows(data, window)
    out = torch.zeros(data.n_rows, dtype=torch.float32, device=data.device)
    rows = torch.as_tensor(host_rows, device=data.device)
    with torch.no_grad():
        for start in range(0, int(host_rows.size), chunk):
            part = rows[start : start + chunk]
            out.index_copy_(
                0, part, predictor(gather_windows(data.features, part, window)).float().reshape(-1)
            )
    return out
