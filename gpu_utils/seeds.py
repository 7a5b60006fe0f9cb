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
coupling would come from a global gradient-norm clip, a shared inf-skip or Adam's shared step count; `SeedOptimStep`
clips per seed, and masks seeds that stopped (early stopping, a KL stop) so that their weights and Adam moments stay
as they were. A loop whose seeds stop and then go on again (a per-update KL stop) asks for ``per_seed_steps``:
each seed's own Adam step count, so its bias correction never counts the steps another seed took while it was held.
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


def _on(mask: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``mask`` on ``device`` as ``dtype``; no call at all where it already is (a no-op ``.to`` still counts as a
    transfer in `SyncCounter`'s CPU accounting)."""
    return mask if mask.device == device and mask.dtype == dtype else mask.to(device, dtype)


def _seed_view(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.reshape(-1, *([1] * (like.dim() - 1)))


class SeedOptimStep(OptimStep):
    """`OptimStep` over stacked parameters: per-seed clipping, per-seed norms, and an ``active`` mask.

    ``step(loss, active)`` takes the [S] per-seed losses (summed for the one backward) and returns the [S]
    pre-clip norms. Seeds where ``active`` is False keep their parameters and Adam state bit for bit (an early
    stopped seed, a seed past its KL limit). No host sync.

    ``per_seed_steps=True`` (Adam only; not under fp16's GradScaler, which keeps the shared count) does the Adam
    update here with an [S] device tensor of step counts, one per seed, instead of torch's one count per tensor:
    a seed held for k steps then goes on exactly as if those steps had not happened, whatever the others did. It
    costs a few elementwise ops per parameter more than torch's fused/foreach kernel, so loops that never hold a
    seed and resume it leave it off.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        plan: PrecisionPlan,
        max_grad_norm: float | None = None,
        *,
        n_seeds: int,
        scaler: torch.amp.GradScaler | None = None,
        per_seed_steps: bool = False,
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
        if per_seed_steps and not isinstance(optimizer, torch.optim.Adam):
            raise ValueError("per_seed_steps: Adam only")
        self.per_seed_steps = per_seed_steps and self.scaler is None
        device = self.params[0].device if self.params else torch.device("cpu")
        self.seed_steps = torch.zeros(n_seeds, dtype=torch.int64, device=device)

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
        per_seed_steps: bool = False,
        capturable: bool = False,
    ) -> SeedOptimStep:
        """Adam (fused on CUDA) over the stacked ``params``; ``capturable``: see `make_optimizer`."""
        optimizer = make_optimizer(
            params, learning_rate, plan, plan.device_type, weight_decay=weight_decay, capturable=capturable
        )
        return cls(optimizer, plan, max_grad_norm, n_seeds=n_seeds, per_seed_steps=per_seed_steps)

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, grad scaler and the per-seed step counts, for resumable training checkpoints."""
        return {**super().state_dict(), "seed_steps": self.seed_steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict`."""
        super().load_state_dict(state)
        if "seed_steps" in state:
            self.seed_steps.copy_(state["seed_steps"])

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
        if self.per_seed_steps:
            self._adam_per_seed(with_grad, active)
            self.optimizer.zero_grad(set_to_none=True)
            return norms
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

    @torch.no_grad()
    def _adam_per_seed(self, params: list[torch.Tensor], active: torch.Tensor | None) -> None:
        """torch's Adam update (betas, eps, weight decay and lr of the first param group) with seed i's bias
        correction from its own step count; seeds where ``active`` is False keep weights and moments exactly."""
        group = self.optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        learning_rate, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        take = (
            torch.ones(self.n_seeds, dtype=torch.bool, device=self.seed_steps.device)
            if active is None
            else _on(active, self.seed_steps.device, torch.bool)
        )
        self.seed_steps += take
        steps = self.seed_steps.clamp(min=1).to(torch.float32)  # a seed that never stepped has no moments
        step_size = learning_rate / (1 - beta1**steps)
        bias2_sqrt = (1 - beta2**steps).sqrt()
        for p in params:
            state = self.optimizer.state[p]
            if (
                not state
            ):  # the layout torch's Adam uses, so its state_dict and load_state_dict hold these too
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            grad = p.grad if weight_decay == 0 else p.grad.add(p, alpha=weight_decay)
            keep = _seed_view(take, p)
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.copy_(torch.where(keep, exp_avg.lerp(grad, 1 - beta1), exp_avg))
            exp_avg_sq.copy_(
                torch.where(keep, exp_avg_sq.mul(beta2).addcmul_(grad, grad, value=1 - beta2), exp_avg_sq)
            )
            denom = (exp_avg_sq.sqrt() / _seed_view(bias2_sqrt, p)).add_(eps)
            update = (exp_avg * _seed_view(step_size, p)).div_(denom)
            p.sub_(torch.where(keep, update, 0.0))

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
