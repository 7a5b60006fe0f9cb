"""Many independent copies of one small network trained as one computation: a leading *seed axis*.

A 64-wide MLP cannot fill a device, S of them side by side can (PureJaxRL's trick). Every tensor that belongs to
one copy carries the copy's index on dim 0; this module holds the pieces every such loop needs and nothing that
knows what is trained:

    params, buffers = stack_modules(modules)             # S modules of one architecture -> stacked leaves
    stepper = SeedOptimStep.adam(params.values(), lr, plan, max_grad_norm, n_seeds=S)
    with stepper.autocast():
        loss_per_seed = ...                              # [S] fp32: each seed's own mean loss
    norms = stepper.step(loss_per_seed, active=mask)     # [S] norms; clip per seed; inactive seeds do not move
    state = unstack_state(params, buffers, i)            # seed i's state_dict, for its own checkpoint

Why the loss is summed over seeds before one backward: d(sum)/d(loss_i) = 1, so every seed's gradient is exactly
the one its own loss gives; Adam is elementwise, so one optimizer over the stacked leaves is S optimizers. The only
coupling would come from a global gradient-norm clip or a shared inf-skip; `SeedOptimStep` clips per seed, and
masks seeds that stopped (early stopping, a KL stop) so that their weights and Adam moments stay as they were.
Under fp16 one GradScaler skips a step for all seeds when any overflowed (a documented coupling: fp16 is only
chosen on Volta/Turing; bf16 and fp32 need no scaler).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from gpu_utils.precision import PrecisionPlan
from gpu_utils.step import OptimStep, make_optimizer

__all__ = ["SeedOptimStep", "per_seed_grad_norms", "stack_modules", "unstack_state"]


def stack_modules(modules: Sequence[nn.Module]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(parameters, buffers) of S same-shaped modules stacked on a new dim 0, parameters as leaf tensors that
    require grad (`torch.func.stack_module_state`); use them with `torch.func.functional_call` under `vmap`, or
    with batched-weight layers."""
    if not modules:
        raise ValueError("stack_modules: no modules")
    params, buffers = torch.func.stack_module_state(list(modules))
    return dict(params), dict(buffers)


def unstack_state(
    params: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor], index: int
) -> dict[str, torch.Tensor]:
    """Seed ``index``'s own ``state_dict`` (detached clones), as one unbatched module would hold it."""
    state = {name: value[index].detach().clone() for name, value in params.items()}
    state.update({name: value[index].detach().clone() for name, value in buffers.items()})
    return state


def per_seed_grad_norms(params: Sequence[torch.Tensor], n_seeds: int) -> torch.Tensor:
    """[S] L2 norms of each seed's gradient over every stacked parameter (dim 0 = seed); no host sync."""
    grads = [p.grad.detach().reshape(n_seeds, -1) for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(n_seeds, dtype=torch.float32, device=params[0].device)
    # one concatenation and one norm instead of a reduction per parameter (small nets: the op count dominates)
    return torch.linalg.vector_norm(torch.cat(grads, dim=1).float(), dim=1)


def _seed_view(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.reshape(-1, *([1] * (like.dim() - 1)))


class SeedOptimStep(OptimStep):
    """`OptimStep` over stacked parameters: per-seed clipping, per-seed norms, and an ``active`` mask.

    ``step(loss, active)`` takes the [S] per-seed losses (summed for the one backward) and returns the [S]
    pre-clip norms. Seeds where ``active`` is False keep their parameters and Adam state bit for bit (an early
    stopped seed, a seed past its KL limit). No host sync.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        plan: PrecisionPlan,
        max_grad_norm: float | None = None,
        *,
        n_seeds: int,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        super().__init__(optimizer, plan, max_grad_norm, scaler=scaler)
        if n_seeds < 1:
            raise ValueError(f"n_seeds must be >= 1, got {n_seeds}")
        for p in self.params:
            if p.dim() == 0 or p.shape[0] != n_seeds:
                raise ValueError(
                    f"a stacked parameter of shape {tuple(p.shape)} has no seed axis of {n_seeds}"
                )
        self.n_seeds = n_seeds

    @classmethod
    def adam(  # type: ignore[override]
        cls,
        params: Iterable[torch.Tensor],
        learning_rate: float,
        plan: PrecisionPlan,
        max_grad_norm: float | None = None,
        *,
        n_seeds: int,
        weight_decay: float = 0.0,
    ) -> SeedOptimStep:
        """Adam (fused on CUDA) over the stacked ``params``."""
        optimizer = make_optimizer(params, learning_rate, plan, plan.device_type, weight_decay=weight_decay)
        return cls(optimizer, plan, max_grad_norm, n_seeds=n_seeds)

    def step(self, loss: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        """Backward of ``loss.sum()`` ([S] fp32 per-seed losses), per-seed clip, step (inactive seeds held),
        zero grads; returns the [S] pre-clip norms as a device tensor."""
        if loss.dtype != torch.float32:
            raise ValueError(f"loss must be float32, got {loss.dtype}: cast outputs with .float() first")
        if loss.shape != (self.n_seeds,):
            raise ValueError(
                f"loss must hold one value per seed, shape ({self.n_seeds},), got {tuple(loss.shape)}"
            )
        total = loss.sum()
        if self.scaler is not None:
            self.scaler.scale(total).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            total.backward()
        with_grad = [p for p in self.params if p.grad is not None]
        norms = per_seed_grad_norms(with_grad, self.n_seeds)
        if not math.isinf(self.max_grad_norm):
            # the same rule as clip_grad_norm_, per seed: scale = min(1, max / (norm + 1e-6))
            scale = (self.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
            for p in with_grad:
                p.grad.mul_(_seed_view(scale, p.grad).to(p.grad.dtype))
        held = None
        if active is not None:
            held = self._snapshot()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if held is not None and active is not None:
            self._restore(held, active)
        self.optimizer.zero_grad(set_to_none=True)
        return norms

    def _snapshot(self) -> list[tuple[torch.Tensor, torch.Tensor, dict[str, Any]]]:
        held = []
        for p in self.params:
            state = self.optimizer.state.get(p, {})
            held.append(
                (p, p.detach().clone(), {k: v.clone() for k, v in state.items() if torch.is_tensor(v)})
            )
        return held

    def _restore(
        self, held: list[tuple[torch.Tensor, torch.Tensor, dict[str, Any]]], active: torch.Tensor
    ) -> None:
        with torch.no_grad():
            for p, before, state_before in held:
                keep = _seed_view(active.to(p.device), p)
                p.copy_(torch.where(keep, p, before))
                state = self.optimizer.state.get(p, {})
                for key, old in state_before.items():
                    new = state[key]
                    if new.dim() > 0 and new.shape[0] == self.n_seeds:
                        new.copy_(torch.where(_seed_view(active.to(new.device), new), new, old))
                    # a scalar 'step' count is shared; Adam's bias correction then differs by the held steps,
                    # so seeds that stop and never resume are unaffected (they do not move again)
