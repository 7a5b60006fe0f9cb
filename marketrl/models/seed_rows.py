"""Which rows each seed of a forecaster batch trains and validates on, and its batch schedule.

One fold (the usual case): every seed trains on the same rows with the same schedule, each in its own order
(`SharedBatches`). Folds on the batch axis (training.batch_folds): the training table stacks several folds
(`marketrl.env.stack_market_data`) and each seed has its own fold's rows, batch size, steps per epoch and step
budget, exactly what its fold alone would give it (`BlockBatches`); seeds validate on their own fold's split
(`SeedValidationRows`). Batches are padded to the widest seed's batch with a validity mask, so every step is one
static-shaped computation for all seeds and a padded row never reaches a loss.

`marketrl.models.supervised_trainer` draws the batches; everything here is device-side except the row
bookkeeping on host integers (no device->host sync).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from marketrl.env import MarketData
from marketrl.models.supervised_data import PREDICT_CHUNK, SupervisedRows, gather_windows

__all__ = ["BlockBatches", "SeedSchedule", "SeedValidationRows", "SharedBatches", "schedule"]


@dataclass(frozen=True)
class SeedSchedule:
    """One seed's training rows and schedule: its batch size, steps per epoch and step budget, and ``group``,
    the index of the run it would be alone (its fold: seeds of one group share rows and schedule)."""

    rows: SupervisedRows
    batch_size: int
    steps_per_epoch: int
    total_steps: int
    group: int


def schedule(
    rows: SupervisedRows, group: int, batch_size: int, largest: int, epochs: int, max_steps: int | None
) -> SeedSchedule:
    """A seed's schedule: the batch ``batch_size`` capped by the memory's ``largest`` and the rows, ``epochs``
    passes over the rows capped at ``max_steps`` optimizer steps."""
    batch = max(1, min(batch_size, largest, rows.n_rows))
    per_epoch = math.ceil(rows.n_rows / batch)
    total = epochs * per_epoch if max_steps is None else min(epochs * per_epoch, max_steps)
    return SeedSchedule(rows, batch, per_epoch, total, group)


class SharedBatches:
    """Every seed on the same rows with the same schedule (one fold): seed i's batch at a step is the next slice
    of its own permutation of the rows, drawn at each epoch's start from its own generator."""

    def __init__(self, plan: SeedSchedule, generators: Sequence[torch.Generator]) -> None:
        self.plan = plan
        self.generators = list(generators)

    def initial_order(self) -> torch.Tensor:
        """The resumable order state before the first epoch ([S, 0]: drawn at step 0)."""
        return torch.zeros(len(self.generators), 0, dtype=torch.int64, device=self.plan.rows.rows.device)

    def draw(
        self, step: int, order: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(windows [S, B, window, F], targets [S, B], validity mask (None: every row counts), the order state)."""
        rows, batch = self.plan.rows, self.plan.batch_size
        position = step % self.plan.steps_per_epoch
        if position == 0:  # each seed's own batch order
            device = rows.rows.device
            order = torch.stack(
                [torch.randperm(rows.n_rows, generator=g, device=device) for g in self.generators]
            )
        picked = rows.rows[order[:, position * batch : (position + 1) * batch]]
        windows, target = rows.batch(picked.reshape(-1))
        n_seeds = len(self.generators)
        return windows.reshape(n_seeds, -1, *windows.shape[1:]), target.reshape(n_seeds, -1), None, order


class BlockBatches:
    """Seeds with their own rows of one stacked table and their own schedules (folds on the batch axis).

    Seed i's batch at a step is the slice of its own permutation that its fold alone would take at that step
    (a shorter last batch of an epoch included); the batch is padded to the widest seed's batch size with a
    validity mask. A seed past its budget keeps drawing (its weights no longer move) so shapes stay static.
    """

    def __init__(self, plans: Sequence[SeedSchedule], generators: Sequence[torch.Generator]) -> None:
        self.plans = list(plans)
        self.generators = list(generators)
        first = self.plans[0].rows
        device = first.rows.device
        self.features, self.target, self.window = first.features, first.target, first.window
        self.counts = [plan.rows.n_rows for plan in self.plans]
        self.width = max(plan.batch_size for plan in self.plans)
        longest = max(self.counts)
        # each seed's rows of the table, padded with its first row to the longest seed's count
        self.table_rows = torch.stack(
            [
                torch.cat([plan.rows.rows, plan.rows.rows[:1].expand(longest - plan.rows.n_rows)])
                for plan in self.plans
            ]
        )
        self.n_rows = torch.tensor(self.counts, device=device)
        self.batch_sizes = torch.tensor([plan.batch_size for plan in self.plans], device=device)
        self.steps_per_epoch = torch.tensor([plan.steps_per_epoch for plan in self.plans], device=device)
        self.offsets = torch.arange(self.width, device=device)

    def initial_order(self) -> torch.Tensor:
        """The resumable order state: [S, longest] (row i's first ``counts[i]`` entries are seed i's order)."""
        return torch.zeros(
            len(self.plans), self.table_rows.shape[1], dtype=torch.int64, device=self.n_rows.device
        )

    def draw(
        self, step: int, order: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(windows [S, B, window, F], targets [S, B], validity mask [S, B], the order state)."""
        device = order.device
        for i, plan in enumerate(self.plans):  # host integers: each seed's epoch starts on its own schedule
            if step < plan.total_steps and step % plan.steps_per_epoch == 0:
                order[i, : plan.rows.n_rows] = torch.randperm(
                    plan.rows.n_rows, generator=self.generators[i], device=device
                )
        start = (step % self.steps_per_epoch) * self.batch_sizes
        stop = torch.minimum(start + self.batch_sizes, self.n_rows)
        index = start[:, None] + self.offsets
        valid = index < stop[:, None]
        picked = order.gather(1, index.clamp_(max=order.shape[1] - 1))
        rows = self.table_rows.gather(1, picked).reshape(-1)
        windows = gather_windows(self.features, rows, self.window)
        n_seeds = len(self.plans)
        return (
            windows.reshape(n_seeds, self.width, *windows.shape[1:]),
            self.target.index_select(0, rows).reshape(n_seeds, self.width),
            valid,
            order,
        )


@dataclass
class SeedValidationRows:
    """Each seed's validation rows when seeds validate on different splits (folds on the batch axis): the
    distinct splits' features and targets stacked, and seed i's rows of them ([S, longest], padded with a valid
    row; ``counts[i]`` real ones, 0 where its split has no usable row)."""

    features: torch.Tensor
    target: torch.Tensor
    rows: torch.Tensor
    counts: list[int]
    window: int

    @classmethod
    def build(cls, splits: Sequence[MarketData], window: int, horizon: int) -> SeedValidationRows | None:
        """One entry per seed (seeds of one fold pass the same split object); None when no split has a row."""
        distinct: dict[int, SupervisedRows] = {}
        for split in splits:
            if id(split) not in distinct:
                distinct[id(split)] = SupervisedRows.build(split, window, horizon)
        offsets, offset = {}, 0
        for key, rows in distinct.items():
            offsets[key], offset = offset, offset + rows.features.shape[0]
        per_seed = [distinct[id(split)].rows + offsets[id(split)] for split in splits]
        counts = [int(distinct[id(split)].n_rows) for split in splits]
        if not any(counts):
            return None
        pad = next(rows[:1] for rows in per_seed if rows.numel())
        longest = max(counts)
        return cls(
            features=torch.cat([rows.features for rows in distinct.values()]),
            target=torch.cat([rows.target for rows in distinct.values()]),
            rows=torch.stack([torch.cat([rows, pad.expand(longest - rows.numel())]) for rows in per_seed]),
            counts=counts,
            window=window,
        )

    def chunks(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(windows [S, C, window, F], targets [S, C], validity [S, C]) in column chunks of about
        `PREDICT_CHUNK` rows in all."""
        n_seeds, longest = self.rows.shape
        size = max(1, PREDICT_CHUNK // n_seeds)
        counts = torch.tensor(self.counts, device=self.rows.device)
        for start in range(0, longest, size):
            rows = self.rows[:, start : start + size]
            flat = rows.reshape(-1)
            windows = gather_windows(self.features, flat, self.window)
            valid = (
                (torch.arange(start, start + rows.shape[1], device=rows.device)[None, :]) < counts[:, None]
            )
            yield (
                windows.reshape(n_seeds, rows.shape[1], *windows.shape[1:]),
                self.target.index_select(0, flat).reshape(rows.shape),
                valid,
            )
