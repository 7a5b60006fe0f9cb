"""Turn a device setting ("auto", "cpu", "cuda", "cuda:1") into a ``torch.device`` that exists."""

from __future__ import annotations

import torch

__all__ = ["DeviceError", "resolve_device"]


class DeviceError(ValueError):
    """The requested device is malformed or not present on this machine."""


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """ "auto" picks the first CUDA device when one is present, else the CPU; explicit CUDA devices must exist."""
    if isinstance(spec, str) and spec.strip().lower() == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(
            f"device {spec!r} is not a torch device (expected 'auto', 'cpu' or 'cuda[:N]')"
        ) from exc
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = device.index if device.index is not None else 0
        if index >= count:
            raise DeviceError(f"device {spec!r} requested but this machine has {count} CUDA device(s)")
        return torch.device("cuda", index)
    return device
