"""Measure that training loops are free of host-device synchronisation (the loops themselves read their
statistics once per window through ``gpu_utils.metrics.DeviceMetrics``).

* ``SyncCounter`` counts calls that force a device->host sync on CUDA, so a CPU-only test can assert a budget.
* ``disable_distribution_validation`` switches off ``torch.distributions`` argument checks (a sync per object).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import torch
import torch.optim.optimizer as _torch_optimizer

__all__ = [
    "SyncCounter",
    "disable_distribution_validation",
    "distribution_validation",
]


# --------------------------------------------------------------------------------------------------------------
# Sync counting
# --------------------------------------------------------------------------------------------------------------

_Predicate = Callable[[tuple[Any, ...], dict[str, Any]], bool]

_lock = threading.RLock()
_active: list[SyncCounter] = []
_saved: list[tuple[object, str, bool, Any]] = []  # (owner, attribute, owner had it in __dict__, original)
_depth = threading.local()


def _always(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return True


def _is_bool_mask(index: Any) -> bool:
    if isinstance(index, torch.Tensor):
        return index.dtype in (torch.bool, torch.uint8)
    if isinstance(index, tuple | list):
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in index)
    return False


def _indexes_with_mask(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return len(args) >= 2 and _is_bool_mask(args[1])


def _caller_frame() -> FrameType | None:
    """The frame that called the patched torch function (the one just outside our wrapper)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not _WRAPPER_CODE:
        frame = frame.f_back
    return frame.f_back if frame is not None else None


def _called_from_torch() -> bool:
    caller = _caller_frame()
    module = caller.f_globals.get("__name__", "") if caller is not None else ""
    return module == "torch" or module.startswith("torch.")


def _copies_to_host(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    # torch's own device-generic code (clipping, GradScaler) calls .to(param.device): on a CPU-only run that
    # looks like .to("cpu") but on CUDA it stays on the GPU, so CPU-to-CPU copies made by torch do not count.
    source = args[0]
    return source.device.type != "cpu" or not _called_from_torch()


def _moves_to_cpu(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    try:
        device = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
    except (TypeError, RuntimeError):
        return False
    return device is not None and device.type == "cpu" and _copies_to_host(args, kwargs)


def _where_single_argument(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return len(args) + len(kwargs) == 1


def _repeats_is_tensor(position: int) -> _Predicate:
    def predicate(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if kwargs.get("output_size") is not None:
            return False
        if len(args) == 1 and "repeats" not in kwargs and position == 1:
            return True  # torch.repeat_interleave(repeats): the output size is data-dependent
        repeats = args[position] if len(args) > position else kwargs.get("repeats")
        return isinstance(repeats, torch.Tensor)

    return predicate


def _not_optimizer_step_counter(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    # torch.optim keeps non-capturable step counters on the host even on CUDA, so their .item() is free.
    caller = _caller_frame()
    return caller is None or caller.f_code is not _torch_optimizer._get_value.__code__


# (owner, attribute, kind, predicate). Tensor methods receive the tensor as args[0].
_T = torch.Tensor
_SPECS: tuple[tuple[object, str, str, _Predicate], ...] = (
    (_T, "item", "item", _not_optimizer_step_counter),
    (_T, "__float__", "float", _always),
    (_T, "__int__", "int", _always),
    (_T, "__bool__", "bool", _always),
    (_T, "__index__", "index", _always),
    (_T, "tolist", "tolist", _always),
    (_T, "cpu", "cpu", _copies_to_host),
    (_T, "to", "to_cpu", _moves_to_cpu),
    (_T, "numpy", "numpy", _always),
    (_T, "nonzero", "nonzero", _always),
    (torch, "nonzero", "nonzero", _always),
    (torch, "argwhere", "nonzero", _always),
    (_T, "argwhere", "nonzero", _always),
    (torch, "where", "nonzero", _where_single_argument),
    (_T, "__getitem__", "mask_index", _indexes_with_mask),
    (_T, "__setitem__", "mask_assign", _indexes_with_mask),
    (_T, "masked_select", "masked_select", _always),
    (torch, "masked_select", "masked_select", _always),
    (_T, "unique", "unique", _always),
    (torch, "unique", "unique", _always),
    (_T, "unique_consecutive", "unique", _always),
    (torch, "unique_consecutive", "unique", _always),
    (_T, "repeat_interleave", "repeat_interleave", _repeats_is_tensor(1)),
    (torch, "repeat_interleave", "repeat_interleave", _repeats_is_tensor(1)),
    (_T, "equal", "equal", _always),
    (torch, "equal", "equal", _always),
    (_T, "allclose", "equal", _always),
    (torch, "allclose", "equal", _always),
    (torch, "is_nonzero", "bool", _always),
)


def _record(kind: str, args: tuple[Any, ...]) -> None:
    subject = args[0] if args and isinstance(args[0], torch.Tensor) else None
    on_cpu = subject is None or subject.device.type == "cpu"
    for counter in list(_active):
        counter._record(kind, on_cpu)


def _wrap(original: Callable[..., Any], kind: str, predicate: _Predicate) -> Callable[..., Any]:
    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, "value", 0)
        # Only the outermost patched call counts: Tensor.unique -> torch.unique is one sync, not two.
        if depth == 0 and predicate(args, kwargs):
            _record(kind, args)
        _depth.value = depth + 1
        try:
            return original(*args, **kwargs)
        finally:
            _depth.value = depth

    return counted


_WRAPPER_CODE = _wrap(len, "", _always).__code__


def _install() -> None:
    for owner, attribute, kind, predicate in _SPECS:
        had_own = attribute in vars(owner)
        original = vars(owner)[attribute] if had_own else None
        _saved.append((owner, attribute, had_own, original))
        setattr(owner, attribute, _wrap(getattr(owner, attribute), kind, predicate))


def _uninstall() -> None:
    while _saved:
        owner, attribute, had_own, original = _saved.pop()
        if had_own:
            setattr(owner, attribute, original)
        else:
            delattr(owner, attribute)


class SyncCounter:
    """Context manager counting calls that would force a host-device sync on CUDA.

    Counted kinds (``by_kind`` keys): item, float, int, bool, index, tolist, cpu, to_cpu, numpy, nonzero
    (incl. argwhere and one-argument torch.where), mask_index (``t[bool_mask]``), mask_assign
    (``t[bool_mask] = v``), masked_select, unique, repeat_interleave (tensor repeats, no output_size),
    equal (equal/allclose). ``count_cpu`` decides whether calls on CPU tensors count: by default they do when
    CUDA is unavailable (a CPU-only test stands in for a GPU run, so ``.cpu()`` on a CPU tensor counts as the
    device->host copy it would be) and do not when CUDA is available. ``.item()`` on torch.optim's host-side
    step counters never counts. Counters nest (each sees every event) and torch is restored on exit, even after
    an exception. Under CUDA, ``cuda_sync_debug_mode`` is also applied for the block (None leaves it alone).
    """

    def __init__(self, *, count_cpu: bool | None = None, cuda_sync_debug_mode: str | None = "warn") -> None:
        self.count_cpu = (not torch.cuda.is_available()) if count_cpu is None else count_cpu
        self.cuda_sync_debug_mode = cuda_sync_debug_mode
        self.by_kind: Counter[str] = Counter()
        self._previous_debug_mode: int | None = None
        self._entered = False

    @property
    def count(self) -> int:
        """Total syncs counted so far."""
        return sum(self.by_kind.values())

    def _record(self, kind: str, on_cpu: bool) -> None:
        if self.count_cpu or not on_cpu:
            self.by_kind[kind] += 1

    def __enter__(self) -> SyncCounter:
        with _lock:
            if self._entered:
                raise RuntimeError("this SyncCounter is already active; create a new one to nest")
            self._entered = True
            _active.append(self)
            if len(_active) == 1:
                _install()
        if self.cuda_sync_debug_mode is not None and torch.cuda.is_available():
            self._previous_debug_mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode(self.cuda_sync_debug_mode)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._previous_debug_mode is not None:
            torch.cuda.set_sync_debug_mode(self._previous_debug_mode)
            self._previous_debug_mode = None
        with _lock:
            _active.remove(self)
            self._entered = False
            if not _active:
                _uninstall()

    def assert_at_most(self, limit: int, what: str = "block") -> None:
        """Raise AssertionError (with the per-kind breakdown) if more than ``limit`` syncs were counted."""
        if self.count > limit:
            raise AssertionError(f"{what}: {self.count} host syncs > budget {limit}: {dict(self.by_kind)}")


def disable_distribution_validation() -> bool:
    """Turn off torch.distributions argument validation (it syncs per construction); return the old default."""
    previous = bool(torch.distributions.Distribution._validate_args)
    torch.distributions.Distribution.set_default_validate_args(False)
    return previous


@contextmanager
def distribution_validation(enabled: bool) -> Iterator[None]:
    """Temporarily set torch.distributions' default argument validation (e.g. re-enable it in a test)."""
    previous = bool(torch.distributions.Distribution._validate_args)
    torch.distributions.Distribution.set_default_validate_args(enabled)
    try:
        yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(previous)
