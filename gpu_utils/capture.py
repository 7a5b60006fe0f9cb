"""One piece of a training loop run as a captured computation: a CUDA graph on an accelerator, eager elsewhere.

A loop whose every step launches hundreds of small kernels is bound by the host's launch rate, however large the
device. `CapturedCall` takes a function of no arguments that reads its inputs from tensors the caller refills in
place and writes its outputs to tensors it owns (the same addresses on every call), and on CUDA records it once as
a CUDA graph: each later call is one graph launch, whatever the function does inside (many optimisation steps,
many copies trained side by side). On the CPU, or with ``capture=False``, it calls the function.

    epoch = CapturedCall(run_epoch, device, capture=True)   # run_epoch: reads `order`, writes `terms`
    for _ in range(n_epochs):
        order.copy_(new_order)
        epoch()                                               # CUDA: warm-up calls, then one capture, graph launches
        metrics.record_rows(terms)

The capture follows torch's rules (docs: "CUDA Graphs", whole-network capture): the first ``warmup`` calls run
eagerly on a side stream (lazy state, e.g. optimizer moments and library workspaces, is made there), the next one
captures and launches the graph. Inside, nothing may sync with the host (torch raises during capture if anything does: the
capture is the proof), the optimizer must be built ``capturable`` (`make_optimizer(capturable=True)`), and a
GradScaler cannot be inside (its skipped steps are decided on the host): `capturable_plan` says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from gpu_utils.precision import PrecisionPlan

__all__ = ["CapturedCall", "capturable_plan"]

log = logging.getLogger(__name__)


def capturable_plan(plan: PrecisionPlan, device: torch.device | str) -> bool:
    """Whether a step under ``plan`` on ``device`` can be captured: CUDA and no GradScaler (fp16's is host-driven)."""
    return torch.device(device).type == "cuda" and not plan.use_grad_scaler


class CapturedCall:
    """``fn()`` eagerly, or on CUDA (with ``capture``) captured once as a CUDA graph and launched (module docs).

    ``calls`` counts calls; ``captured`` says whether later calls are graph launches. Where torch cannot capture
    ``fn`` (an operation inside that syncs or is not capturable), a warning names the reason (``failure``) and
    every call runs eagerly: slower, never different.
    """

    def __init__(
        self, fn: Callable[[], None], device: torch.device | str, *, capture: bool, warmup: int = 2
    ) -> None:
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (torch needs eager calls before a capture), got {warmup}")
        self.fn = fn
        self.device = torch.device(device)
        self.capture = capture and self.device.type == "cuda"
        self.warmup = warmup
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failure: str | None = None  # why a capture failed (the call then runs eagerly)
        self.name = getattr(fn, "__name__", "fn")

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self) -> None:
        self.calls += 1
        if not self.capture:
            self.fn()
        elif self.graph is not None:
            self.graph.replay()
        elif self.calls <= self.warmup:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self.fn()
            torch.cuda.current_stream(self.device).wait_stream(side)
        else:
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    self.fn()
            except RuntimeError as error:  # something inside cannot be captured: run eagerly from now on
                log.warning("could not capture %s as a CUDA graph (%s); it runs eagerly", self.name, error)
                self.capture = False
                self.failure = str(error).splitlines()[0] if str(error) else type(error).__name__
                torch.cuda.synchronize(self.device)
                self.fn()
                return
            self.graph = graph
            log.info("captured %s as a CUDA graph after %d eager calls", self.name, self.warmup)
            graph.replay()  # the capture recorded the work without running it
