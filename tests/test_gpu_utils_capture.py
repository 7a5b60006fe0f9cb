"""gpu_utils' pieces for captured training steps, on the CPU: `CapturedCall` runs eagerly there, a block of
statistics rows equals the same rows one by one, a capturable optimizer's device learning rate keeps its
tensor through schedules and checkpoints, and `SeedStreams` draws each copy's own numbers in a fixed number of
operations. (The capture itself needs CUDA: bench/gpu/gpu_check.py's ``capture``
section compares captured and eager training on the device.)"""

from __future__ import annotations

import copy

import pytest
import torch

from gpu_utils import CapturedCall, DeviceMetrics, OptimStep, capturable_plan, make_optimizer
from gpu_utils.precision import select_precision
from gpu_utils.streams import SeedStreams


def test_captured_call_runs_eagerly_on_the_cpu() -> None:
    seen = []
    call = CapturedCall(lambda: seen.append(len(seen)), "cpu", capture=True)
    for _ in range(5):
        call()
    assert seen == [0, 1, 2, 3, 4] and call.calls == 5 and not call.captured
    with pytest.raises(ValueError, match="warmup"):
        CapturedCall(lambda: None, "cpu", capture=True, warmup=0)


def test_only_cuda_without_a_grad_scaler_is_capturable() -> None:
    cpu_plan = select_precision("cpu", None)
    assert not capturable_plan(cpu_plan, "cpu")
    assert capturable_plan(select_precision("NVIDIA H100 80GB HBM3", (9, 0)), "cuda")  # bf16
    assert not capturable_plan(select_precision("Tesla T4", (7, 5)), "cuda")  # fp16: a GradScaler
    with pytest.raises(ValueError, match="CUDA"):
        make_optimizer([torch.nn.Parameter(torch.zeros(2))], 1e-3, cpu_plan, "cpu", capturable=True)


@pytest.mark.parametrize("capacity", [3, 8])
def test_a_block_of_rows_reads_as_the_same_rows_one_by_one(capacity: int) -> None:
    """record_rows folds past the capacity exactly as record does (capacity 3 < 7 rows folds twice)."""
    values = torch.randn(7, 2)
    one_by_one = DeviceMetrics(["a", "b"], "cpu", capacity=capacity)
    block = DeviceMetrics(["a", "b"], "cpu", capacity=capacity)
    for row in values:
        one_by_one.record(list(row.unbind()))
    block.record_rows(values[:4])
    block.record_rows(values[4:])
    assert block.read(7) == one_by_one.read(7)
    with pytest.raises(ValueError, match="rows must be"):
        block.record_rows(torch.zeros(2, 3))


def test_a_device_learning_rate_keeps_its_tensor_through_schedule_and_checkpoint() -> None:
    """A captured step reads the rate by address: set_learning_rate and load_state_dict write into it."""
    parameter = torch.nn.Parameter(torch.ones(3))
    rate = torch.tensor(0.1)
    plan = select_precision("cpu", None)
    step = OptimStep(torch.optim.Adam([parameter], lr=rate, foreach=False), plan)
    step.set_learning_rate(0.05)
    assert step.optimizer.param_groups[0]["lr"] is rate and rate.item() == pytest.approx(0.05)
    (parameter.sum()).backward()
    step.optimizer.step()
    saved = copy.deepcopy(step.state_dict())  # as a checkpoint file holds it
    step.set_learning_rate(0.2)
    step.load_state_dict(saved)
    assert step.optimizer.param_groups[0]["lr"] is rate and rate.item() == pytest.approx(0.05)


def _streams(seeds: list[int]) -> SeedStreams:
    return SeedStreams.from_generators([torch.Generator().manual_seed(seed) for seed in seeds], "cpu")


def test_a_copys_stream_is_its_own_in_any_batch() -> None:
    batch, alone = _streams([3, 5, 9]), _streams([5])
    for _ in range(3):
        assert torch.equal(batch.permutations(50)[1], alone.permutations(50)[0])
        assert torch.equal(batch.integers(7, 40)[1], alone.integers(7, 40)[0])
    order = _streams([1]).permutations(1000)[0]
    assert torch.equal(order.sort().values, torch.arange(1000))  # a permutation
    assert not torch.equal(order, torch.arange(1000))


def test_a_held_copy_keeps_range_order_and_does_not_draw() -> None:
    streams, reference = _streams([1, 2]), _streams([1, 2])
    held = streams.permutations(20, torch.tensor([True, False]))
    assert torch.equal(held[1], torch.arange(20))
    assert torch.equal(held[0], reference.permutations(20)[0])
    # copy 1 resumes where it stopped: its next permutation is reference's first one
    assert torch.equal(streams.permutations(20)[1], _streams([1, 2]).permutations(20)[1])


def test_integers_are_uniform_and_the_state_resumes_the_stream() -> None:
    streams = _streams([4])
    counts = torch.bincount(streams.integers(10, 50_000)[0], minlength=10).float()
    assert ((counts - 5_000).abs() < 5 * 5_000**0.5).all()  # within 5 sigma of uniform
    saved = copy.deepcopy(streams.state_dict())
    expected = streams.integers(1000, 30)
    resumed = _streams([0])
    resumed.load_state_dict(saved)
    assert torch.equal(resumed.integers(1000, 30), expected)
    with pytest.raises(ValueError, match="high"):
        streams.integers(0, 3)


def test_drawing_for_more_copies_issues_no_more_operations() -> None:
    def ops(n_copies: int) -> int:
        streams = _streams(list(range(n_copies)))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            streams.permutations(64, torch.ones(n_copies, dtype=torch.bool))
            streams.integers(100, 64)
        return sum(1 for event in prof.events() if event.name.startswith("aten::"))

    assert ops(1) == ops(16)
