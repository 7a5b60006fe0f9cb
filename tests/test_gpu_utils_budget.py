"""Budget arithmetic on a hand-computed model (a 3,363-parameter MLP with a frozen copy) and device detection."""

from __future__ import annotations

import json

import pytest
import torch

from gpu_utils import (
    BudgetError,
    HardwareBudget,
    mlp_parameter_count,
    sample_bytes,
    select_precision,
    static_memory_bytes,
)

# A Q-network 10->64->32->16->3: 704 + 2080 + 528 + 51 parameters, trained with a frozen target copy.
PARAMS = 3363
# One sample: 3 forward passes x (64+32+16+3) layer outputs, and a 23-float input row.
ACTIVATIONS, INPUT_FLOATS = 3 * 115, 23
PER_SAMPLE = 3 * 115 * 4 * 4 + 23 * 4  # fp32 activations x safety factor 4 + the fp32 inputs
LIMITS = (32, 8192)


def test_mlp_parameter_count_by_hand() -> None:
    assert mlp_parameter_count(10, [64, 32, 16], 3) == PARAMS
    assert mlp_parameter_count(2, [], 1) == 3
    # Cross-check against torch's own count of the same stack.
    layers = [
        torch.nn.Linear(10, 128),
        torch.nn.Linear(128, 64),
        torch.nn.Linear(64, 32),
        torch.nn.Linear(32, 1),
    ]
    assert mlp_parameter_count(10, [128, 64, 32], 1) == sum(p.numel() for m in layers for p in m.parameters())


def test_static_memory_by_hand() -> None:
    # Trained: weights + grads + 2 Adam moments = 4 fp32 copies; frozen: 1 copy; buffers as given.
    assert static_memory_bytes(PARAMS) == PARAMS * 4 * 4
    assert static_memory_bytes(PARAMS, frozen_parameter_count=PARAMS) == PARAMS * 5 * 4 == 67260
    assert static_memory_bytes(PARAMS, frozen_parameter_count=PARAMS, buffer_bytes=92_000) == 67260 + 92_000


def test_sample_bytes_by_hand() -> None:
    assert sample_bytes(ACTIVATIONS, INPUT_FLOATS, "fp32") == PER_SAMPLE == 5612
    assert sample_bytes(ACTIVATIONS, INPUT_FLOATS, "bf16") == 3 * 115 * 2 * 4 + 92 == 2852
    assert sample_bytes(324, 17, select_precision("cpu", None)) == 324 * 4 * 4 + 68 == 5252


def _budget(device_type: str, free: int) -> HardwareBudget:
    return HardwareBudget(device_type, "test device", total_memory_bytes=2 * free, free_memory_bytes=free)


def _bounds(
    budget: HardwareBudget, per_sample: int = PER_SAMPLE, buffer_bytes: int = 92_000
) -> tuple[int, int]:
    return budget.batch_size_bounds(
        PARAMS, per_sample, limits=LIMITS, frozen_parameter_count=PARAMS, buffer_bytes=buffer_bytes
    )


def test_batch_bounds_on_gpu_use_half_of_free_memory() -> None:
    static = 67260 + 92_000
    free = 2 * (static + 1003 * PER_SAMPLE)  # room for exactly 1003 samples -> 1000 after rounding down to 8
    assert _bounds(_budget("cuda", free)) == (32, 1000)
    assert _bounds(_budget("cuda", free - 2)) == (32, 1000)
    # The same free memory holds about twice the batch when a sample costs about half (bf16 activations).
    low, high = _bounds(_budget("cuda", free), per_sample=2852)
    assert (low, high) == (32, (free // 2 - static) // 2852 // 8 * 8)
    assert high % 8 == 0 and high > 1900


def test_batch_bounds_on_cpu_use_a_quarter_of_available_ram() -> None:
    free = 4 * (14660 * 16 + 100 * 5252)
    budget = _budget("cpu", free)
    assert budget.batch_size_bounds(14660, 5252, limits=(64, 65536)) == (64, 96)


def test_batch_bounds_are_clamped_to_the_limits() -> None:
    assert _bounds(_budget("cuda", 80 * 2**30)) == LIMITS


def test_batch_bounds_refuse_what_cannot_fit_and_bad_arguments() -> None:
    tiny = _budget("cuda", 2 * (67260 + 92_000_000))
    with pytest.raises(BudgetError, match=r"big model needs .* for batch 32"):
        tiny.batch_size_bounds(
            PARAMS,
            PER_SAMPLE,
            limits=LIMITS,
            frozen_parameter_count=PARAMS,
            buffer_bytes=92_000_000,
            what="big model",
        )
    with pytest.raises(BudgetError, match="limits"):
        tiny.batch_size_bounds(PARAMS, PER_SAMPLE, limits=(64, 32))
    with pytest.raises(BudgetError, match="bytes_per_sample"):
        tiny.batch_size_bounds(PARAMS, 0, limits=LIMITS)
    with pytest.raises(BudgetError, match="precision"):
        sample_bytes(ACTIVATIONS, INPUT_FLOATS, "int8")
    with pytest.raises(BudgetError, match="buffer_bytes"):
        static_memory_bytes(PARAMS, buffer_bytes=-1)
    with pytest.raises(BudgetError, match="parameter_count"):
        static_memory_bytes(1.5)  # type: ignore[arg-type]


def test_detect_cpu_reads_host_memory() -> None:
    budget = HardwareBudget.detect("cpu")
    assert budget.device_type == "cpu"
    assert 0 < budget.free_memory_bytes <= budget.total_memory_bytes
    assert budget.memory_fraction == 0.25
    assert json.loads(json.dumps(budget.to_dict()))["device_type"] == "cpu"


def test_detect_cuda_reads_mem_get_info(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=None: (30 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    budget = HardwareBudget.detect("cuda")
    assert budget.free_memory_bytes == 30 * 2**30
    assert budget.total_memory_bytes == 80 * 2**30
    assert budget.capability == (9, 0)
    assert budget.usable_bytes == 15 * 2**30
    assert budget.to_dict()["capability"] == [9, 0]


def test_resolve_device() -> None:
    from gpu_utils import DeviceError, resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(DeviceError, match="not a torch device"):
        resolve_device("gpu0")
    with pytest.raises(DeviceError, match="CUDA device"):
        resolve_device(f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
