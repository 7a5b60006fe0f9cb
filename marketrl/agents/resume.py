"""Resumable training: a training loop's complete state in one file, written atomically every N env steps.

A long training job that dies (node lost, SIGKILL, wall-time limit) restarts from its last checkpoint instead of
from step 0, and on the same device it ends with exactly the weights an uninterrupted run gives: the state holds
the networks, the optimizer (and grad scaler), the replay buffer or rollout position, every RNG the loop draws
from (the trainer's generator and the env's), the env's positions and clocks, the device-side statistics window
and the step counters.

The file is plain data (tensors, lists, dicts, numbers, strings) loaded with ``torch.load(weights_only=True)``.
It carries a *fingerprint* of the run (algorithm, seed, hyperparameters, length, inputs...): a state saved by a
different run (changed hyperparameters, new data) is ignored with a warning rather than resumed. Before each
save the networks are checked for NaN/inf, so the file on disk is always the last *good* state.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpu_utils import NonFiniteError
from marketrl.io import atomic_write
from marketrl.testing_hooks import hold_point

__all__ = ["TrainingCheckpoint", "to_cpu", "to_device"]

log = logging.getLogger(__name__)

FORMAT = "marketrl-resume"
VERSION = 1


def to_cpu(value: Any) -> Any:
    """A deep copy of nested dicts/lists/tuples with every tensor detached and copied to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, Mapping):
        return {key: to_cpu(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_cpu(item) for item in value)
    return value


def to_device(value: Any, device: torch.device) -> Any:
    """Nested dicts/lists/tuples with every tensor moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, Mapping):
        return {key: to_device(item, device) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_device(item, device) for item in value)
    return value


class TrainingCheckpoint:
    """The resume file of one training run: ``load`` at the start, ``save`` when ``due``, ``remove`` when done.

    ``every`` is the cadence in env steps (0 disables saving; an existing file is still resumed).
    ``fingerprint`` is plain data identifying the run; a file whose fingerprint differs is not resumed.
    """

    def __init__(self, path: str | os.PathLike[str], every: int, fingerprint: Mapping[str, Any]) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(f"training.checkpoint_every: expected an integer >= 0, got {every!r}")
        self.path = Path(path)
        self.every = every
        self.fingerprint = to_cpu(dict(fingerprint))
        self.saves = 0
        self.resumed_from: int | None = None
        self._next_at = every

    def load(self) -> dict[str, Any] | None:
        """The saved loop state of this run, or None (no file, another run's file, or an unreadable one)."""
        if not self.path.exists():
            return None
        try:
            saved = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a damaged file must not block the job: it trains from scratch instead
            log.warning("%s: unreadable resume checkpoint ignored: %s", self.path, str(exc).splitlines()[0])
            return None
        if not isinstance(saved, dict) or saved.get("format") != FORMAT or saved.get("version") != VERSION:
            log.warning("%s: not a marketrl resume checkpoint; ignored", self.path)
            return None
        if saved.get("fingerprint") != self.fingerprint:
            log.warning(
                "%s: saved by a different run (settings or inputs changed); training from scratch", self.path
            )
            return None
        self.resumed_from = int(saved["env_steps"])
        self._next_at = self._after(self.resumed_from)
        log.info("resuming from %s at env step %d", self.path, self.resumed_from)
        return saved["state"]

    def due(self, env_steps: int) -> bool:
        """Whether a multiple of ``every`` was crossed since the last save (or the resumed step)."""
        return self.every > 0 and env_steps >= self._next_at

    def save(self, env_steps: int, state: Mapping[str, Any], networks: Iterable[nn.Module]) -> None:
        """Check ``networks`` are finite, then atomically replace the file with ``state`` (copied to the CPU).

        A non-finite parameter raises ``NonFiniteError`` and keeps the previous (good) file.
        """
        params = [p.detach().reshape(-1) for net in networks for p in net.parameters()]
        if params and not bool(torch.isfinite(torch.cat(params)).all()):
            raise NonFiniteError(
                f"non-finite network parameters at env step {env_steps}; last good checkpoint kept at {self.path}"
            )
        payload = {
            "format": FORMAT,
            "version": VERSION,
            "env_steps": int(env_steps),
            "fingerprint": self.fingerprint,
            "state": to_cpu(dict(state)),
        }
        with atomic_write(self.path) as tmp:
            torch.save(payload, tmp)
        self.saves += 1
        self._next_at = self._after(env_steps)
        log.info("checkpoint at env step %d: %s", env_steps, self.path)
        hold_point(f"training_checkpoint_saved:{self.path}")

    def remove(self) -> None:
        """Delete the file (the run finished and its final model is written)."""
        self.path.unlink(missing_ok=True)

    def _after(self, env_steps: int) -> int:
        return (env_steps // self.every + 1) * self.every if self.every > 0 else 0
