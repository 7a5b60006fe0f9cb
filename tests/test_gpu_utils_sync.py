"""NaNGuard, DeviceMetrics and SyncCounter: host-read budgets, error messages, and torch left as found."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu_utils import (
    DeviceMetrics,
    NaNGuard,
    NonFiniteError,
    SyncCounter,
    disable_distribution_validation,
    distribution_validation,
)

# ----------------------------------------------------------------------------------------------------------
# SyncCounter
# ----------------------------------------------------------------------------------------------------------

PATCHED_TENSOR_ATTRIBUTES = [
    "item",
    "__float__",
    "__int__",
    "__bool__",
    "__index__",
    "tolist",
    "cpu",
    "to",
    "numpy",
    "nonzero",
    "__getitem__",
    "__setitem__",
    "masked_select",
    "unique",
    "repeat_interleave",
]
PATCHED_TORCH_FUNCTIONS = ["nonzero", "masked_select", "unique", "repeat_interleave", "where", "argwhere"]


def _snapshot() -> tuple[dict[str, object], dict[str, object]]:
    tensor_own = {name: torch.Tensor.__dict__.get(name) for name in PATCHED_TENSOR_ATTRIBUTES}
    functions = {name: getattr(torch, name) for name in PATCHED_TORCH_FUNCTIONS}
    return tensor_own, functions


@pytest.mark.parametrize(
    ("kind", "action"),
    [
        ("item", lambda x: x.sum().item()),
        ("float", lambda x: float(x[0, 0])),
        ("int", lambda x: int(x[0, 0])),
        ("bool", lambda x: bool(x.sum() > 0)),
        ("bool", lambda x: 1 if (x > 0).any() else 0),
        ("index", lambda x: range(torch.tensor(3))),
        ("tolist", lambda x: x.tolist()),
        ("cpu", lambda x: x.cpu()),
        ("to_cpu", lambda x: x.to("cpu")),
        ("to_cpu", lambda x: x.to(device=torch.device("cpu"), dtype=torch.float64)),
        ("numpy", lambda x: x.numpy()),
        ("numpy", lambda x: np.asarray(x)),
        ("nonzero", lambda x: x.nonzero()),
        ("nonzero", lambda x: torch.nonzero(x)),
        ("nonzero", lambda x: torch.argwhere(x)),
        ("nonzero", lambda x: torch.where(x > 0)),
        ("mask_index", lambda x: x[x > 0]),
        ("mask_index", lambda x: x[:, x[0] > 0]),
        ("mask_assign", lambda x: x.clone().__setitem__(x > 0, 0.0)),
        ("masked_select", lambda x: x.masked_select(x > 0)),
        ("masked_select", lambda x: torch.masked_select(x, x > 0)),
        ("unique", lambda x: x.unique()),
        ("unique", lambda x: torch.unique(x)),
        ("unique", lambda x: torch.unique_consecutive(x)),
        ("repeat_interleave", lambda x: torch.repeat_interleave(torch.tensor([1, 2]))),
        ("repeat_interleave", lambda x: x[0].repeat_interleave(torch.tensor([1, 2, 1]))),
        ("equal", lambda x: torch.equal(x, x)),
        ("equal", lambda x: x.allclose(x)),
    ],
)
def test_each_claimed_kind_counts_exactly_once(kind: str, action) -> None:
    x = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.0, -1.0]])
    with SyncCounter(count_cpu=True) as counter:
        action(x)
    assert counter.by_kind == {kind: 1}
    assert counter.count == 1


@pytest.mark.parametrize(
    "action",
    [
        lambda x: x * 2 + 1,
        lambda x: x[0, 1:],  # basic indexing
        lambda x: x[torch.tensor([0, 1])],  # integer advanced indexing: no sync
        lambda x: torch.where(x > 0, x, 0.0),  # three-argument where
        lambda x: x.masked_fill(x > 0, 0.0),
        lambda x: x.to(torch.float64),  # dtype only
        lambda x: x.repeat_interleave(2),  # int repeats
        lambda x: x[0].repeat_interleave(torch.tensor([1, 2, 1]), output_size=4),
        lambda x: (torch.isfinite(x).all(), x.sum(), x.max()),
    ],
)
def test_sync_free_operations_are_not_counted(action) -> None:
    x = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.0, -1.0]])
    with SyncCounter(count_cpu=True) as counter:
        action(x)
    assert counter.count == 0, counter.by_kind


def test_cpu_tensors_do_not_count_when_count_cpu_is_off() -> None:
    x = torch.ones(3)
    with SyncCounter(count_cpu=False) as counter:
        x.sum().item()
        x.tolist()
        x[x > 0]
    assert counter.count == 0


def test_counter_restores_torch_on_exit_and_on_exception() -> None:
    before = _snapshot()
    with SyncCounter(count_cpu=True):
        assert torch.Tensor.__dict__.get("__bool__") is not None  # really patched inside
    assert _snapshot() == before
    with pytest.raises(ZeroDivisionError), SyncCounter(count_cpu=True):
        _ = 1 / 0
    assert _snapshot() == before
    x = torch.tensor([1.0, -1.0, 2.0])
    assert x[x > 0].tolist() == [1.0, 2.0]  # indexing and bool behave normally afterwards
    assert bool(x.sum() > 0) is True
    with SyncCounter(count_cpu=True) as counter:
        x.sum().item()
    assert counter.count == 1  # and a second counter installs cleanly


def test_counters_nest_and_each_sees_its_own_block() -> None:
    before = _snapshot()
    x = torch.arange(4.0)
    with SyncCounter(count_cpu=True) as outer:
        x.tolist()
        with SyncCounter(count_cpu=True) as inner:
            x.sum().item()
        assert _snapshot() != before  # the outer counter is still installed
        x.cpu()
    assert inner.by_kind == {"item": 1}
    assert outer.by_kind == {"tolist": 1, "item": 1, "cpu": 1}
    assert _snapshot() == before
    with pytest.raises(RuntimeError, match="already active"), outer, outer:
        pass
    assert _snapshot() == before


def test_nested_torch_calls_count_once() -> None:
    """Tensor.unique calls torch.unique and np.asarray calls Tensor.numpy: one sync each, not two."""
    x = torch.tensor([3, 1, 3])
    with SyncCounter(count_cpu=True) as counter:
        x.unique()
        np.asarray(x)
    assert counter.by_kind == {"unique": 1, "numpy": 1}


def test_torch_internals_run_under_the_counter() -> None:
    """A PPO-like loss (distributions, cross-entropy, backward) works with __bool__/__getitem__ patched."""
    torch.manual_seed(0)
    net = torch.nn.Linear(5, 3)
    obs = torch.randn(16, 5)
    with distribution_validation(False), SyncCounter(count_cpu=True) as counter:
        dist = torch.distributions.Categorical(logits=net(obs))
        actions = dist.sample()
        loss = -(dist.log_prob(actions) * torch.randn(16)).mean() - 0.01 * dist.entropy().mean()
        loss = loss + torch.nn.functional.cross_entropy(net(obs), actions)
        loss.backward()
    assert counter.count == 0, counter.by_kind
    assert net.weight.grad is not None


def test_distribution_validation_syncs_and_disabling_it_does_not() -> None:
    logits = torch.randn(8, 3)
    with distribution_validation(True), SyncCounter(count_cpu=True) as validated:
        torch.distributions.Categorical(logits=logits)
    assert validated.count >= 1
    with distribution_validation(True):
        previous = disable_distribution_validation()
        with SyncCounter(count_cpu=True) as unvalidated:
            torch.distributions.Categorical(logits=logits)
        assert previous is True
        assert torch.distributions.Distribution._validate_args is False
    assert unvalidated.count == 0


def test_assert_at_most_reports_the_breakdown() -> None:
    with SyncCounter(count_cpu=True) as counter:
        torch.ones(2).tolist()
        torch.ones(2).sum().item()
    counter.assert_at_most(2)
    with pytest.raises(AssertionError, match="'tolist': 1"):
        counter.assert_at_most(1, "loop")


# ----------------------------------------------------------------------------------------------------------
# NaNGuard
# ----------------------------------------------------------------------------------------------------------


def test_clean_run_of_1000_steps_costs_ten_reads() -> None:
    guard = NaNGuard(check_every=100)
    torch.manual_seed(0)
    with SyncCounter(count_cpu=True) as counter:
        for _ in range(1000):
            loss = torch.randn(()).abs()
            guard.watch("loss", loss)
            guard.watch("q_values", torch.randn(32, 3))
            guard.end_step()
        guard.close()  # nothing pending after a full window: no extra read
    assert counter.by_kind == {"tolist": 10}
    assert guard.host_reads == 10


def test_injected_nan_is_caught_within_the_window_with_one_read() -> None:
    guard = NaNGuard(check_every=100)
    with SyncCounter(count_cpu=True) as counter:
        for _ in range(200):
            guard.watch("loss", torch.tensor(1.0))
            guard.end_step()
        assert counter.count == 2
        with pytest.raises(NonFiniteError) as caught:
            for step in range(201, 301):
                value = float("nan") if step == 250 else 1.0
                guard.watch("loss", torch.tensor(value))
                guard.watch("grad_norm", torch.tensor(1.0))
                guard.end_step()
    assert counter.count == 3  # one read per window, including the failing one
    assert guard.step == 300
    message = str(caught.value)
    assert "'loss'" in message
    assert "between steps 201 and 300" in message
    assert "grad_norm" not in message


def test_inf_in_several_tensors_is_named_and_close_checks_partial_window() -> None:
    guard = NaNGuard(check_every=100)
    for _ in range(50):
        guard.watch("loss", torch.tensor(1.0))
        guard.end_step()
    guard.watch("loss", torch.tensor([1.0, float("inf")]))
    guard.watch("logits", torch.tensor([[float("-inf"), 0.0]]))
    guard.end_step()
    with pytest.raises(NonFiniteError, match=r"'loss', 'logits' between steps 1 and 51"):
        guard.close()


def test_check_every_one_reports_the_exact_step() -> None:
    guard = NaNGuard(check_every=1)
    guard.watch("x", torch.tensor(0.0))
    guard.end_step()
    guard.watch("x", torch.tensor(float("nan")))
    with pytest.raises(NonFiniteError, match="at step 2"):
        guard.end_step()


def test_guard_context_manager_checks_on_exit_and_validates_arguments() -> None:
    with pytest.raises(NonFiniteError), NaNGuard(check_every=1000) as guard:
        guard.watch("value", torch.tensor(float("nan")))
        guard.end_step()
    with pytest.raises(ValueError, match="check_every"):
        NaNGuard(check_every=0)


# ----------------------------------------------------------------------------------------------------------
# DeviceMetrics
# ----------------------------------------------------------------------------------------------------------


def test_metrics_flush_once_per_window_with_correct_means() -> None:
    metrics = DeviceMetrics(flush_every=10)
    records = []
    with SyncCounter(count_cpu=True) as counter:
        for step in range(1, 31):
            metrics.add("loss", torch.tensor(float(step)))
            metrics.add("q", torch.tensor([step, -step], dtype=torch.float32))
            metrics.add("epsilon", 0.5)  # host value: no device work at all
            record = metrics.end_step()
            if record is not None:
                records.append(record)
    assert counter.by_kind == {"tolist": 3}
    assert metrics.host_reads == 3
    assert [r["step"] for r in records] == [10, 20, 30]
    assert records[0]["loss"] == pytest.approx(5.5)
    assert records[0]["loss_min"] == 1.0
    assert records[0]["loss_max"] == 10.0
    assert records[1]["loss"] == pytest.approx(15.5)
    assert records[1]["q"] == pytest.approx(0.0)
    assert records[1]["q_min"] == -20.0
    assert records[1]["q_max"] == 20.0
    assert records[2]["epsilon"] == 0.5
    assert metrics.history == records


def test_metrics_mix_host_and_device_values_and_flush_partial() -> None:
    metrics = DeviceMetrics(flush_every=100, extrema=False)
    metrics.add("reward", torch.tensor([1.0, 2.0, 3.0]))
    metrics.add("reward", 6.0)
    metrics.add("empty", torch.zeros(0))
    metrics.end_step()
    record = metrics.flush()
    assert record == {"step": 1, "reward": pytest.approx(3.0)}
    assert metrics.flush() is None
