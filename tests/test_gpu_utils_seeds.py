"""gpu_utils.seeds: S stacked copies train exactly as S separate ones, clip per seed, and never leak across seeds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpu_utils import OptimStep, SeedOptimStep, resolve_precision, stack_modules, unstack_state


def _modules(n: int, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)) for _ in range(n)]


def _data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(n, 16, 4, generator=generator), torch.randn(n, 16, generator=generator)


def _stacked_run(modules, x, y, steps, max_norm, active=None, per_seed_steps=False):
    plan = resolve_precision("fp32", "cpu")
    params, buffers = stack_modules(modules)
    stepper = SeedOptimStep.adam(
        params.values(), 1e-2, plan, max_norm, n_seeds=len(modules), per_seed_steps=per_seed_steps
    )
    base = modules[0]

    def forward(p, b, xs):
        return torch.func.functional_call(base, (p, b), (xs,)).squeeze(-1)

    norms = []
    for step in range(steps):
        out = torch.vmap(forward)(params, buffers, x)
        loss = (out - y).square().mean(dim=1)
        norms.append(stepper.step(loss, active[step] if isinstance(active, list) else active))
    return params, buffers, norms


@pytest.mark.parametrize("per_seed_steps", [False, True])
def test_stacked_equals_separate_with_per_seed_clipping(per_seed_steps: bool):
    modules = _modules(3)
    x, y = _data(3)
    params, buffers, norms = _stacked_run(
        modules, x, y, steps=5, max_norm=0.05, per_seed_steps=per_seed_steps
    )
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


def test_per_seed_steps_a_held_seed_goes_on_as_if_the_held_steps_never_happened():
    """Seed 0 takes the same 4 real steps in both runs; the batch holds it for 2 steps in one run and 1 in the
    other (the others kept going): with per-seed step counts it ends bit-identical, and equal to a separate run
    of 4 steps; with torch's shared count its bias correction would differ."""
    x, y = _data(3)
    on, off = torch.tensor([True, True, True]), torch.tensor([False, True, True])
    results = {}
    for per_seed_steps in (False, True):
        long_hold, _, _ = _stacked_run(
            _modules(3), x, y, 6, 0.5, active=[on, on, off, off, on, on], per_seed_steps=per_seed_steps
        )
        short_hold, _, _ = _stacked_run(
            _modules(3), x, y, 5, 0.5, active=[on, on, off, on, on], per_seed_steps=per_seed_steps
        )
        results[per_seed_steps] = (long_hold, short_hold)
    long_hold, short_hold = results[True]
    for name, value in long_hold.items():
        assert torch.equal(value[0], short_hold[name][0]), name
    assert not all(torch.equal(v[0], results[False][1][k][0]) for k, v in results[False][0].items())

    plan = resolve_precision("fp32", "cpu")
    alone = _modules(3)[0]
    stepper = OptimStep.adam(alone.parameters(), 1e-2, plan, 0.5)
    for _ in range(4):
        stepper.step((alone(x[0]).squeeze(-1) - y[0]).square().mean())
    for name, value in alone.state_dict().items():
        torch.testing.assert_close(long_hold[name][0], value, rtol=1e-5, atol=1e-6)


def test_per_seed_steps_state_round_trip():
    x, y = _data(2)
    plan = resolve_precision("fp32", "cpu")
    params, _ = stack_modules(_modules(2))
    stepper = SeedOptimStep.adam(params.values(), 1e-2, plan, n_seeds=2, per_seed_steps=True)
    base = _modules(1)[0]

    def loss():
        out = torch.vmap(lambda p, xs: torch.func.functional_call(base, p, (xs,)).squeeze(-1))(params, x)
        return (out - y).square().mean(dim=1)

    stepper.step(loss(), torch.tensor([True, False]))
    state = stepper.state_dict()
    assert state["seed_steps"].tolist() == [1, 0]
    fresh = SeedOptimStep.adam(params.values(), 1e-2, plan, n_seeds=2, per_seed_steps=True)
    fresh.load_state_dict(state)
    assert fresh.seed_steps.tolist() == [1, 0]
