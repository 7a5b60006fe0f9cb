"""DeviceMetrics (statistics + NaN guard) and SyncCounter: host-read budgets, error messages, torch left as found."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu_utils import (
    DeviceMetrics,
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
# DeviceMetrics: statistics and the NaN guard in one read per window
# ----------------------------------------------------------------------------------------------------------


def _run(
    metrics: DeviceMetrics, steps: range, check_every: int, value=lambda step: float(step)
) -> list[dict]:
    reads = []
    for step in steps:
        metrics.record([torch.tensor(value(step)), torch.tensor(-float(step))])
        if step % check_every == 0:
            reads.append(metrics.read(step))
    return reads


def test_clean_run_of_1000_steps_costs_ten_reads() -> None:
    metrics = DeviceMetrics(["loss", "q"], "cpu", watched=("loss",), capacity=100)
    with SyncCounter(count_cpu=True) as counter:
        reads = _run(metrics, range(1, 1001), 100)
    assert counter.by_kind == {"tolist": 10}
    assert metrics.host_reads == 10 and len(reads) == 10


def test_window_means_extrema_and_counters() -> None:
    metrics = DeviceMetrics(["loss", "q"], "cpu", counters=("done",), capacity=4, counter_width=3)
    done = metrics.counter("done")
    for step in range(1, 11):  # capacity 4 < window 10: the buffer is folded twice on the device
        done.add_(torch.tensor([1.0, 0.0, 2.0]))
        metrics.record([torch.tensor(float(step)), torch.tensor(-float(step))])
    assert metrics.pending == 10
    read = metrics.read(10)
    assert read == {
        "loss": pytest.approx(5.5),
        "loss_min": 1.0,
        "loss_max": 10.0,
        "q": pytest.approx(-5.5),
        "q_min": -10.0,
        "q_max": -1.0,
        "done": 30.0,
        "count": 10,
    }
    empty = metrics.read(10)  # reset: nothing recorded since
    assert empty["count"] == 0 and empty["loss"] is None and empty["done"] == 0.0


def test_injected_nan_is_caught_within_the_window_with_one_read() -> None:
    metrics = DeviceMetrics(["loss", "grad_norm"], "cpu", watched=("loss", "grad_norm"), capacity=100)
    with SyncCounter(count_cpu=True) as counter:
        _run(metrics, range(1, 201), 100)
        assert counter.count == 2
        with pytest.raises(NonFiniteError) as caught:
            _run(metrics, range(201, 301), 100, value=lambda step: float("nan") if step == 250 else 1.0)
    assert counter.count == 3  # one read per window, including the failing one
    message = str(caught.value)
    assert "'loss'" in message and "between steps 201 and 300" in message
    assert "grad_norm" not in message  # -step is finite: only the poisoned column is named


def test_unwatched_columns_may_be_non_finite_and_watched_names_are_checked() -> None:
    metrics = DeviceMetrics(["loss", "ratio"], "cpu", watched=("loss",))
    metrics.record([torch.tensor(1.0), torch.tensor(float("inf"))])
    assert metrics.read(1)["ratio_max"] == float("inf")
    with pytest.raises(ValueError, match="watched"):
        DeviceMetrics(["loss"], "cpu", watched=("los",))


def test_combine_weights_reads_by_count() -> None:
    metrics = DeviceMetrics(["loss", "q"], "cpu", counters=("done",))
    first = _run(metrics, range(1, 3), 2)  # steps 1, 2
    second = _run(metrics, range(3, 9), 8)  # steps 3..8
    combined = metrics.combine(first + second)
    assert combined["count"] == 8
    assert (
        combined["loss"] == pytest.approx(4.5) and combined["loss_min"] == 1.0 and combined["loss_max"] == 8.0
    )
    assert combined["q_min"] == -8.0 and combined["done"] == 0.0


def test_state_dict_round_trip_continues_the_window() -> None:
    reference = DeviceMetrics(["loss", "q"], "cpu", capacity=3)
    _run(reference, range(1, 6), 100)
    resumed = DeviceMetrics(["loss", "q"], "cpu", capacity=3)
    resumed.load_state_dict(
        {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in reference.state_dict().items()}
    )
    for metrics in (reference, resumed):
        _run(metrics, range(6, 8), 100)
    assert resumed.read(7) == reference.read(7)
