"""Resumable training: a training loop's complete state in one file, written atomically every N steps.

A loop hands its stateful pieces to `resume_or_start` once and then makes two calls, ``run.log(record)`` and
``run.maybe_save(step)``; nothing here knows what is trained (DQN, PPO or a supervised model):

    state = LoopState(obs=env.reset())                      # a dataclass of the loop's own variables
    run = resume_or_start(checkpoint, {"model": net, "optim": stepper, "metrics": metrics}, state,
                          total_steps=total, device=device)  # restores all of it in place from a saved state
    for step in range(state.step, total): ...; run.log(record); run.maybe_save(step + 1)
    summary = run.finish(total)                             # steps_per_second, history

A long training job that dies (node lost, SIGKILL, wall-time limit) restarts from its last checkpoint instead of
from step 0, and on the same device it ends with exactly the weights an uninterrupted run gives: the state holds
the networks, the optimizer (and grad scaler), the replay buffer or rollout position, every RNG the loop draws
from (the trainer's generator and the env's), the env's positions and clocks, the device-side statistics window
and the step counters.

The file is plain data (tensors, lists, dicts, numbers, strings) loaded with ``torch.load(weights_only=True)``.
It carries a *fingerprint* of the run (model, seed, hyperparameters, length, inputs...): a state saved by a
different run (changed hyperparameters, new data) is ignored with a warning rather than resumed. Before each
save the networks are checked for NaN/inf, so the file on disk is always the last *good* state.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from gpu_utils import NonFiniteError
from marketrl.runtime.io import atomic_write
from marketrl.runtime.testing_hooks import hold_point

__all__ = ["Run", "TrainingCheckpoint", "resume_or_start", "to_cpu", "to_device"]

log = logging.getLogger(__name__)

FORMAT = "marketrl-resume"
VERSION = 3  # 2: component states by name, loop variables, history; 3: PPO's stacked seed axis (older files are not resumed)
Loop = TypeVar("Loop")


def to_cpu(value: Any) -> Any:
    """A deep copy of nested dicts/lists/tuples with every tensor detached and copied to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, np.ndarray):  # weights_only loading accepts tensors, not arrays
        return torch.from_numpy(value.copy())
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

    ``every`` is the cadence in the loop's steps (env steps for the agents); 0 disables saving, an existing file
    is still resumed.
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
        self._parts: list[TrainingCheckpoint] = []

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
        self.resumed_from = int(saved["step"])
        self._next_at = self._after(self.resumed_from)
        log.info("resuming from %s at step %d", self.path, self.resumed_from)
        return saved["state"]

    def due(self, step: int) -> bool:
        """Whether a multiple of ``every`` was crossed since the last save (or the resumed step)."""
        return self.every > 0 and step >= self._next_at

    def save(self, step: int, state: Mapping[str, Any], networks: Iterable[nn.Module]) -> None:
        """Check ``networks`` are finite, then atomically replace the file with ``state`` (copied to the CPU).

        A non-finite parameter raises ``NonFiniteError`` and keeps the previous (good) file.
        """
        params = [p.detach().reshape(-1) for net in networks for p in net.parameters()]
        if params and not bool(torch.isfinite(torch.cat(params)).all()):
            raise NonFiniteError(
                f"non-finite network parameters at step {step}; last good checkpoint kept at {self.path}"
            )
        payload = {
            "format": FORMAT,
            "version": VERSION,
            "step": int(step),
            "fingerprint": self.fingerprint,
            "state": to_cpu(dict(state)),
        }
        with atomic_write(self.path) as tmp:
            torch.save(payload, tmp)
        self.saves += 1
        self._next_at = self._after(step)
        log.info("checkpoint at step %d: %s", step, self.path)
        hold_point(f"training_checkpoint_saved:{self.path}")

    def part(self, name: str) -> TrainingCheckpoint:
        """A sibling resume file for one part of this run (e.g. one seed of a batch trained one after another):
        ``resume.pt`` -> ``resume.{name}.pt``, same cadence, the fingerprint plus the part's name; `remove`
        deletes it with this one."""
        part = TrainingCheckpoint(
            self.path.with_name(f"{self.path.stem}.{name}{self.path.suffix}"),
            self.every,
            {**self.fingerprint, "part": name},
        )
        self._parts.append(part)
        return part

    @property
    def total_saves(self) -> int:
        """Saves of this file and of its parts."""
        return self.saves + sum(part.saves for part in self._parts)

    def remove(self) -> None:
        """Delete the file and its parts' (the run finished and its final models are written)."""
        self.path.unlink(missing_ok=True)
        for part in self._parts:
            part.remove()

    def _after(self, step: int) -> int:
        return (step // self.every + 1) * self.every if self.every > 0 else 0


class Run:
    """A training loop's resumable state and its history; made by `resume_or_start`."""

    def __init__(
        self,
        checkpoint: TrainingCheckpoint | None,
        components: Mapping[str, Any],
        loop: Any,
        *,
        total_steps: int,
        device: torch.device,
    ) -> None:
        loop_fields = [field.name for field in dataclasses.fields(loop)]
        clash = set(components) & {*loop_fields, "history"}
        if clash:
            raise ValueError(f"component names {sorted(clash)} clash with loop variables")
        self.checkpoint = checkpoint
        self.components = dict(components)
        self.loop = loop
        self.total_steps = total_steps
        self.device = device
        self.history: list[dict[str, Any]] = []
        self.on_log: Callable[[dict[str, Any]], None] | None = None  # live listener (TensorBoard); not saved
        self._loop_fields = loop_fields
        self._start_step = 0
        self._started = time.perf_counter()

    def log(self, record: dict[str, Any]) -> None:
        """Append one statistics record (it is part of the saved state, so a resumed run keeps earlier ones) and
        hand it to ``on_log``, if set."""
        self.history.append(record)
        log.debug("%s", record)
        if self.on_log is not None:
            self.on_log(record)

    def maybe_save(self, step: int) -> None:
        """Save the full state if the checkpoint is due at ``step`` (never after the last step: the caller writes
        the final model instead). Host integers only: no device sync unless it saves."""
        if self.checkpoint is None or step >= self.total_steps or not self.checkpoint.due(step):
            return
        state = {name: _state_of(component) for name, component in self.components.items()}
        state.update({name: getattr(self.loop, name) for name in self._loop_fields}, history=self.history)
        networks = [c for c in self.components.values() if isinstance(c, nn.Module)]
        self.checkpoint.save(step, state, networks)

    def finish(self, step: int) -> dict[str, Any]:
        """``steps_per_second`` of this process's part of the run (after the device drained) and ``history``."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - self._started
        done = step - self._start_step
        return {"steps_per_second": done / elapsed if elapsed > 0 else float("inf"), "history": self.history}

    def _resume(self) -> None:
        saved = self.checkpoint.load() if self.checkpoint is not None else None
        if saved is None:
            return
        for name, component in self.components.items():  # CPU tensors: load_state_dict copies to the device
            if isinstance(component, torch.Generator):
                component.set_state(saved[name])
            else:
                component.load_state_dict(saved[name])
        for name in self._loop_fields:
            current, value = getattr(self.loop, name), saved[name]
            setattr(
                self.loop,
                name,
                value.numpy() if isinstance(current, np.ndarray) else to_device(value, self.device),
            )
        self.history = saved["history"]
        self._start_step = self.checkpoint.resumed_from or 0
        self._started = time.perf_counter()


def _state_of(component: Any) -> Any:
    if isinstance(component, torch.Generator):
        return component.get_state()
    return component.state_dict()


def resume_or_start(
    checkpoint: TrainingCheckpoint | None,
    components: Mapping[str, Any],
    loop: Loop,
    *,
    total_steps: int,
    device: torch.device,
    on_log: Callable[[dict[str, Any]], None] | None = None,
) -> Run:
    """Restore ``components`` (anything with ``state_dict``/``load_state_dict``, or a ``torch.Generator``) and the
    fields of the ``loop`` dataclass in place from ``checkpoint``'s saved state of this run, if any.

    ``total_steps`` is where the loop ends (nothing is saved there). Numpy fields of ``loop`` are saved as tensors
    and restored as numpy arrays; tensor fields are restored on ``device``. ``on_log`` receives each statistics
    record as it is logged (records from before a resume are not replayed).
    """
    run = Run(checkpoint, components, loop, total_steps=total_steps, device=device)
    run._resume()
    run.on_log = on_log
    return run
