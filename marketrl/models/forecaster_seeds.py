"""S forecasters of one architecture as one module (`ForecasterSeeds`), and when to vectorize them over the seed
axis (`vectorize_seeds`); `marketrl.models.supervised_trainer` trains them."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpu_utils.seeds import stack_modules, unstack_state

__all__ = ["ForecasterSeeds", "vectorize_seeds"]


class ForecasterSeeds(nn.Module):
    """S modules of one architecture as one: their parameters and buffers stacked on dim 0
    (`gpu_utils.stack_modules`) and called through `torch.func.functional_call`, either under `torch.vmap` (one
    seed per slice, ``randomness="different"``: each seed its own dropout masks) when ``vectorize``, or seed after
    seed on slices of the stacked leaves (the module's own fused kernels; see `vectorize_seeds`). Either way the
    gradient lands on the stacked leaves, so one optimizer steps all seeds. A module, so that the resume file saves
    the stacked state like any network and checks it for NaN before writing.
    """

    def __init__(self, modules: Sequence[nn.Module], vectorize: bool = True) -> None:
        super().__init__()
        params, buffers = stack_modules(modules)
        self.n_seeds = len(modules)
        self.vectorize = vectorize and self.n_seeds > 1
        # the architecture without storage; in a tuple so it is no submodule (nothing of it in the state_dict)
        self._template = (copy.deepcopy(modules[0]).to("meta"),)
        self._names = list(params)
        self._buffer_names = list(buffers)
        for name, value in params.items():
            self.register_parameter(_key(name), nn.Parameter(value.detach()))
        for name, value in buffers.items():
            self.register_buffer(_key(name), value)

    def stacked(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(parameters, buffers) by the modules' own names, each [S, ...]."""
        params = {name: getattr(self, _key(name)) for name in self._names}
        return params, {name: getattr(self, _key(name)) for name in self._buffer_names}

    def forward(self, windows: torch.Tensor, *, shared: bool = False) -> torch.Tensor:
        """[S, B, window, F] (or [B, window, F] seen by every seed when ``shared``) -> module outputs [S, B]."""
        template = self._template[0].train(self.training)

        def one(
            params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor
        ) -> torch.Tensor:
            return functional_call(template, (params, buffers), (x,))

        params, buffers = self.stacked()
        if not self.vectorize:
            return torch.stack(
                [
                    one(
                        {name: value[i] for name, value in params.items()},
                        {name: value[i] for name, value in buffers.items()},
                        windows if shared else windows[i],
                    )
                    for i in range(self.n_seeds)
                ]
            )
        # attention: the math kernel batches under vmap; the CPU flash kernel has no batching rule (torch would
        # loop over the seeds with a warning)
        with sdpa_kernel([SDPBackend.MATH]):
            return torch.vmap(one, in_dims=(0, 0, None if shared else 0), randomness="different")(
                params, buffers, windows
            )

    def seed_state(self, index: int) -> dict[str, torch.Tensor]:
        """Seed ``index``'s own state_dict (`gpu_utils.unstack_state`)."""
        return unstack_state(*self.stacked(), index)


def vectorize_seeds(module: nn.Module, device: torch.device) -> bool:
    """Whether S seeds of ``module`` run under vmap (True) or seed after seed (False) on ``device``.

    vmap turns S small kernels into one, which is what fills a GPU: every module is vectorized there. On one CPU
    thread the arithmetic is the same either way and vmap saves only per-op overhead, while batched weights lose
    the fast kernels (5 seeds at demo sizes, bench/speed/seeds_forecasters.py, speed-up over 5 single-seed runs: MLP
    1.66x, LSTM as a loop over rows 0.46x, transformer with math attention 0.83x, TCN's grouped convolutions
    0.77x, DLinear 0.76x). So on the CPU only a module that opts in (a class attribute ``seeds_vmap_on_cpu =
    True`` on it or a submodule: the MLP) is vectorized; the others run their seeds one after another, each with
    its own kernels, in the same loop (one optimizer step, one data gather, one statistics read for all).
    """
    if device.type != "cpu":
        return True
    return any(getattr(m, "seeds_vmap_on_cpu", False) for m in module.modules())


def _key(name: str) -> str:
    return name.replace(".", ":")  # a module attribute name cannot hold a dot
