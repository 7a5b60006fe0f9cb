"""gpu_utils.seeds: S stacked copies train exactly as S separate ones, clip per seed, and never leak across seeds."""

from __future__ import annotations

import torch
from torch import nn

from gpu_utils import OptimStep, SeedOptimStep, resolve_precision, stack_modules, unstack_state


def _modules(n: int, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)) for _ in range(n)]


def _data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(n, 16, 4, generator=generator), torch.randn(n, 16, generator=generator)


def _stacked_run(modules, x, y, steps, max_norm, active=None):
    plan = resolve_precision("fp32", "cpu")
    params, buffers = stack_modules(modules)
    stepper = SeedOptimStep.adam(params.values(), 1e-2, plan, max_norm, n_seeds=len(modules))
    base = modules[0]

    def forward(p, b, xs):
        return torch.func.functional_call(base, (p, b), (xs,)).squeeze(-1)

    norms = []
    for _ in range(steps):
        out = torch.vmap(forward)(params, buffers, x)
        loss = (out - y).square().mean(dim=1)
        norms.append(stepper.step(loss, active))
    return params, buffers, norms


def test_stacked_equals_separate_with_per_seed_clipping():
    modules = _modules(3)
    x, y = _data(3)
    params, buffers, norms = _stacked_run(modules, x, y, steps=5, max_norm=0.05)
    plan = resolve_precision("fp32", "cpu")
    for i, module in enumerate(modules):
        stepper = OptimStep.adam(module.parameters(), 1e-2, plan, 0.05)
        for step in range(5):
            loss = (module(x[i]).squeeze(-1) - y[i]).square().mean()
            norm = stepper.step(loss)
            torch.testing.assert_close(norms[step][i], norm, rtol=1e-5, atol=1e-6)
        for name, value in module.state_dict().items():
            torch.testing.assert_close(unstack_state(params, buffers, i)[name], value, rtol=1e-5, atol=1e-6)


def test_inactive_seed_is_held_bit_for_bit():
    modules = _modules(3)
    before = [unstack_state(*stack_modules([m]), 0) for m in modules]
    x, y = _data(3)
    params, buffers, _ = _stacked_run(
        modules, x, y, steps=3, max_norm=None, active=torch.tensor([True, False, True])
    )
    after = unstack_state(params, buffers, 1)
    for name, value in before[1].items():
        assert torch.equal(after[name], value)
    assert not torch.equal(unstack_state(params, buffers, 0)["0.weight"], before[0]["0.weight"])


def test_perturbing_one_seed_leaves_the_others_bit_identical():
    x, y = _data(3)
    reference, ref_buffers, _ = _stacked_run(_modules(3), x, y, steps=4, max_norm=0.5)
    perturbed = _modules(3)
    with torch.no_grad():
        perturbed[1][0].weight.mul_(3.0)
    x2 = x.clone()
    x2[1] += 1.0
    params, buffers, _ = _stacked_run(perturbed, x2, y, steps=4, max_norm=0.5)
    for seed in (0, 2):
        for name, value in unstack_state(reference, ref_buffers, seed).items():
            assert torch.equal(unstack_state(params, buffers, seed)[name], value), (seed, name)
    assert not torch.equal(
        unstack_state(params, buffers, 1)["0.weight"], unstack_state(reference, ref_buffers, 1)["0.weight"]
    )
