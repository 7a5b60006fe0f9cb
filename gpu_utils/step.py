"""One optimisation step done the same way by every trainer: autocast, backward, clip, step, zero.

Contract for trainers:

* run the forward pass inside ``OptimStep.autocast()``;
* cast the model's outputs to fp32 with ``.float()`` *before* computing the loss, so the loss (and its
  reduction) is always fp32 whatever the autocast dtype — ``step`` refuses a non-fp32 loss;
* call ``step(loss)``; it returns the global grad norm as a device tensor (never a Python float), to be recorded
  in ``DeviceMetrics`` so nothing syncs with the host inside the loop;
* ``state_dict`` / ``load_state_dict`` cover the optimizer and the grad scaler, for resumable training.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from gpu_utils.precision import PrecisionPlan

__all__ = ["OptimStep", "make_optimizer"]

log = logging.getLogger(__name__)


def make_optimizer(
    params: Iterable[torch.nn.Parameter],
    lr: float,
    plan: PrecisionPlan,
    device: torch.device | str,
    *,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    fused: bool | None = None,
    capturable: bool = False,
) -> torch.optim.Adam:
    """Adam with the fastest update kernel for the device.

    ``fused=None`` means: fused on CUDA (one kernel for all parameters, and GradScaler hands it the inf flag
    on-device instead of calling ``.item()`` every step), ``foreach`` elsewhere. If the fused kernel is not
    available for these parameters, fall back to ``foreach`` with a log line. ``capturable`` (CUDA only): a step
    that can be recorded in a CUDA graph (step counts on the device, the learning rate a device tensor that
    `OptimStep.set_learning_rate` updates in place).
    """
    params = list(params)
    device_type = torch.device(device).type
    if capturable:
        if device_type != "cuda":
            raise ValueError(f"capturable Adam needs a CUDA device, got {device_type}")
        rate = torch.tensor(float(lr), device=params[0].device)
        return torch.optim.Adam(
            params,
            lr=rate,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            capturable=True,
            **({"fused": True} if (fused is None or fused) and _fused_unsupported(params) is None else {}),
        )
    want_fused = device_type == "cuda" if fused is None else fused
    if want_fused:
        unsupported = _fused_unsupported(params)
        if unsupported is None:
            return torch.optim.Adam(
                params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True
            )
        log.info("fused Adam unavailable (%s); using foreach Adam", unsupported)
    log.debug("Adam (foreach) for %s with precision %s", device_type, plan.mode)
    return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=True)


def _fused_unsupported(params: list[torch.nn.Parameter]) -> str | None:
    """Why fused Adam cannot take these parameters (torch only complains at the first step), or None."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        devices = set(_get_fused_kernels_supported_devices())
    except ImportError:  # private helper moved: assume the long-supported pair
        devices = {"cuda", "cpu"}
    for p in params:
        if not p.is_floating_point() or p.device.type not in devices:
            return f"parameter of dtype {p.dtype} on {p.device.type}"
    return None


class OptimStep:
    """Autocast context plus a sync-free ``step(loss)`` for one optimizer under a ``PrecisionPlan``.

    ``scaler`` may be injected (e.g. ``torch.amp.GradScaler("cpu")`` in tests); by default an fp16 plan gets
    ``torch.amp.GradScaler(plan.device_type)`` and other plans get none. ``max_grad_norm=None`` (or inf)
    disables clipping but the norm is still computed and returned.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        plan: PrecisionPlan,
        max_grad_norm: float | None = None,
        *,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {max_grad_norm!r}")
        self.optimizer = optimizer
        self.plan = plan
        self.max_grad_norm = math.inf if max_grad_norm is None else float(max_grad_norm)
        if scaler is None and plan.use_grad_scaler:
            scaler = torch.amp.GradScaler(plan.device_type)
        self.scaler = scaler
        self.params = [p for group in optimizer.param_groups for p in group["params"]]

    @classmethod
    def adam(
        cls,
        params: Iterable[torch.nn.Parameter],
        learning_rate: float,
        plan: PrecisionPlan,
        max_grad_norm: float | None = None,
    ) -> OptimStep:
        """The usual set-up: `make_optimizer` (Adam, fused on CUDA) over ``params`` on the plan's device type."""
        return cls(make_optimizer(params, learning_rate, plan, plan.device_type), plan, max_grad_norm)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Forward-pass context of the plan (`PrecisionPlan.autocast`)."""
        with self.plan.autocast():
            yield

    def set_learning_rate(self, learning_rate: float) -> None:
        """Set every parameter group's learning rate (schedules); a tensor rate (capturable) in place."""
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(learning_rate)
            else:
                group["lr"] = learning_rate

    def state_dict(self) -> dict[str, Any]:
        """Optimizer and grad-scaler state, for resumable training checkpoints."""
        scaler = self.scaler.state_dict() if self.scaler is not None else None
        return {"optimizer": self.optimizer.state_dict(), "scaler": scaler}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict` (tensors are moved to the parameters' device by the optimizer; a capturable
        optimizer's device learning rate keeps its tensor, the address a captured step reads)."""
        rates = [group["lr"] for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state["optimizer"])
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            if isinstance(rate, torch.Tensor):
                rate.copy_(torch.as_tensor(group["lr"]))
                group["lr"] = rate
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])

    def step(self, loss: torch.Tensor) -> torch.Tensor:
        """Backward, unscale (fp16), clip the global grad norm, step, zero grads; return the pre-clip norm.

        The returned norm is a 0-dim device tensor. Under fp16 a step whose gradients overflowed is skipped by
        the scaler and the returned norm is inf/nan: that is the scaler working, not divergence.
        """
        if loss.dtype != torch.float32:
            raise ValueError(
                f"loss must be float32, got {loss.dtype}: cast Q-values/logits/values with .float() "
                "before computing the loss"
            )
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        with_grad = [p for p in self.params if p.grad is not None]
        if math.isinf(self.max_grad_norm):
            norm = torch.nn.utils.get_total_norm([p.grad for p in with_grad])
        else:
            # error_if_nonfinite=False keeps clipping free of host syncs (no check of the norm on the host).
            norm = torch.nn.utils.clip_grad_norm_(with_grad, self.max_grad_norm, error_if_nonfinite=False)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm.detach()
