"""When a training loop evaluates (the periodic validation score every model reports) and how it seeds its
network initialization."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

__all__ = ["EvalCallback", "EvalSchedule", "SeedsEvalCallback", "seeded"]

#: on_eval(env_steps, policy) -> validation score or None; may raise (e.g. optuna.TrialPruned) to stop training.
EvalCallback = Callable[[int, Callable[[torch.Tensor], torch.Tensor]], float | None]
#: on_eval(env_steps, policies) for S seeds trained as one batch: one greedy policy per seed in, one score (or
#: None) per seed out; may raise to stop the whole batch.
SeedsEvalCallback = Callable[[int, list[Callable[[torch.Tensor], torch.Tensor]]], Sequence[float | None]]


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block (network initialization) under a fixed seed without disturbing the caller's global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class EvalSchedule:
    """Calls ``on_eval`` whenever the step count crosses a multiple of ``every`` (0: only at the end); the
    scores are kept in ``records`` and in the resumable state. ``on_eval`` may raise to stop training (pruning).

    ``on_eval`` is an `EvalCallback` (records ``[step, score]``) or a `SeedsEvalCallback` (records
    ``[step, [score per seed]]``; `seed_records` gives one seed's ``[step, score]`` list).
    """

    def __init__(self, on_eval: EvalCallback | None, every: int) -> None:
        self.on_eval = on_eval
        self.every = int(every)
        self.next_at = self.every if self.every > 0 else None
        self.records: list[list[Any]] = []
        self._last_step: int | None = None

    def due(self, env_steps: int) -> bool:
        """Whether `maybe` at ``env_steps`` would evaluate (a loop that must prepare its policies asks first)."""
        return self.on_eval is not None and self.next_at is not None and env_steps >= self.next_at

    def maybe(self, env_steps: int, policy: Any) -> None:
        """Evaluate if a multiple of ``every`` was reached since the last call."""
        if not self.due(env_steps):
            return
        while self.next_at <= env_steps:
            self.next_at += self.every
        self._call(env_steps, policy)

    def final(self, env_steps: int, policy: Any) -> None:
        """Evaluate at the end of training (unless the last evaluation was at this very step)."""
        if self.on_eval is not None and self._last_step != env_steps:
            self._call(env_steps, policy)

    def seed_records(self, index: int) -> list[list[float | None]]:
        """Seed ``index``'s ``[step, score]`` records, from the per-seed scores of a `SeedsEvalCallback`."""
        return [[step, scores[index]] for step, scores in self.records]

    def state_dict(self) -> dict[str, Any]:
        """Schedule position and the scores so far, for resumable training checkpoints."""
        return {"next_at": self.next_at, "records": self.records, "last_step": self._last_step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict`."""
        self.next_at = state["next_at"]
        self.records = [list(record) for record in state["records"]]
        self._last_step = state["last_step"]

    def _call(self, env_steps: int, policy: Any) -> None:
        self._last_step = env_steps
        score = self.on_eval(env_steps, policy)
        if isinstance(score, Sequence):
            self.records.append([env_steps, [_score(value) for value in score]])
        else:
            self.records.append([env_steps, _score(score)])


def _score(value: float | None) -> float | None:
    return None if value is None else float(value)
