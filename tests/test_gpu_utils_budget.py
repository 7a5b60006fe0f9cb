"""Budget arithmetic on hand-computed examples (obs_dim=10, hidden_dim_base=64) and device detection."""

from __future__ import annotations

import json

import pytest
import torch

from gpu_utils import (
    BudgetError,
    HardwareBudget,
    mlp_parameter_count,
    parameter_count,
    per_sample_bytes,
    select_precision,
    static_memory_bytes,
)

OBS, BASE = 10, 64
# DQN Q-net 10->64->32->16->3: 704 + 2080 + 528 + 51
DQN_PARAMS = 3363
# PPO policy 10->64->32->3: 704 + 2080 + 99; value 10->128->64->32->1: 1408 + 8256 + 2080 + 33
PPO_PARAMS = 2883 + 11777


def test_mlp_parameter_count_by_hand() -> None:
    assert mlp_parameter_count(10, [64, 32, 16], 3) == DQN_PARAMS
    assert mlp_parameter_count(2, [], 1) == 3
    # Cross-check against torch's own count of the same stack.
    layers = [
        torch.nn.Linear(10, 128),
        torch.nn.Linear(128, 64),
        torch.nn.Linear(64, 32),
        torch.nn.Linear(32, 1),
    ]
    assert mlp_parameter_count(10, [128, 64, 32], 1) == sum(p.numel() for m in layers for p in m.parameters())


def test_parameter_count_per_kind() -> None:
    assert parameter_count("dqn", OBS, BASE) == DQN_PARAMS
    assert parameter_count("ppo", OBS, BASE) == PPO_PARAMS == 14660


def test_static_memory_by_hand() -> None:
    # DQN: weights + grads + 2 Adam moments + target net = 5 fp32 copies; replay (2*10 + 3) floats a row.
    assert static_memory_bytes("dqn", OBS, BASE) == 3363 * 5 * 4
    assert static_memory_bytes("dqn", OBS, BASE, replay_capacity=1000) == 67260 + 1000 * 23 * 4
    # PPO: 4 fp32 copies (no target net); rollout (10 + 7) floats a row.
    assert static_memory_bytes("ppo", OBS, BASE, replay_capacity=2048) == 14660 * 4 * 4 + 2048 * 17 * 4


def test_per_sample_bytes_by_hand() -> None:
    # DQN: 3 passes x (64+32+16+3) widths x 4 bytes x safety 4, plus the sampled row (23 floats).
    assert per_sample_bytes("dqn", OBS, BASE, "fp32") == 3 * 115 * 4 * 4 + 23 * 4 == 5612
    assert per_sample_bytes("dqn", OBS, BASE, "bf16") == 3 * 115 * 2 * 4 + 92 == 2852
    # PPO: (64+32+3) + (128+64+32+1) = 324 widths, plus the rollout row (17 floats).
    assert per_sample_bytes("ppo", OBS, BASE, select_precision("cpu", None)) == 324 * 4 * 4 + 68 == 5252


def _budget(device_type: str, free: int) -> HardwareBudget:
    return HardwareBudget(device_type, "test device", total_memory_bytes=2 * free, free_memory_bytes=free)


def test_batch_bounds_on_gpu_use_half_of_free_memory() -> None:
    static = 67260 + 1000 * 92
    free = 2 * (static + 1003 * 5612)  # room for exactly 1003 samples -> 1000 after rounding down to 8
    assert _budget("cuda", free).batch_size_bounds("dqn", OBS, BASE, replay_capacity=1000) == (32, 1000)
    assert _budget("cuda", free - 2).batch_size_bounds("dqn", OBS, BASE, replay_capacity=1000) == (32, 1000)
    # The same free memory holds about twice the batch in bf16.
    low, high = _budget("cuda", free).batch_size_bounds(
        "dqn", OBS, BASE, replay_capacity=1000, precision="bf16"
    )
    assert (low, high) == (32, (free // 2 - static) // 2852 // 8 * 8)
    assert high % 8 == 0 and high > 1900


def test_batch_bounds_on_cpu_use_a_quarter_of_available_ram() -> None:
    static = 14660 * 16
    free = 4 * (static + 100 * 5252)
    assert _budget("cpu", free).batch_size_bounds("ppo", OBS, BASE) == (64, 96)


def test_batch_bounds_are_clamped_to_algorithm_limits() -> None:
    big = _budget("cuda", 80 * 2**30)
    assert big.batch_size_bounds("dqn", OBS, BASE) == (32, 8192)
    assert big.batch_size_bounds("ppo", OBS, BASE) == (64, 65536)


def test_batch_bounds_refuse_what_cannot_fit() -> None:
    tiny = _budget("cuda", 2 * (67260 + 1_000_000 * 92))
    with pytest.raises(BudgetError, match="replay_capacity=1000000"):
        tiny.batch_size_bounds("dqn", OBS, BASE, replay_capacity=1_000_000)
    with pytest.raises(BudgetError, match="kind"):
        tiny.batch_size_bounds("a2c", OBS, BASE)  # type: ignore[arg-type]
    with pytest.raises(BudgetError, match="hidden_dim_base"):
        parameter_count("dqn", OBS, 2)
    with pytest.raises(BudgetError, match="precision"):
        per_sample_bytes("dqn", OBS, BASE, "int8")
    with pytest.raises(BudgetError, match="replay_capacity"):
        static_memory_bytes("dqn", OBS, BASE, replay_capacity=-1)


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
