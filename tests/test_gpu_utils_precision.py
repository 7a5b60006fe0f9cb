"""Precision selection over real device names/capabilities, overrides, and the optimizer-step helper on CPU."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from gpu_utils import (
    OptimStep,
    PrecisionError,
    PrecisionPlan,
    SyncCounter,
    detect_precision,
    lookup_gpu,
    make_optimizer,
    select_precision,
)

# (name as torch.cuda.get_device_name reports it, capability or None, expected auto mode)
AUTO_CASES = [
    ("NVIDIA H100 80GB HBM3", (9, 0), "bf16"),
    ("NVIDIA H100 PCIe", None, "bf16"),
    ("NVIDIA H200", None, "bf16"),
    ("NVIDIA GH200 480GB", None, "bf16"),
    ("NVIDIA H20", None, "bf16"),
    ("NVIDIA A100-SXM4-80GB", (8, 0), "bf16"),
    ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", None, "bf16"),
    ("NVIDIA A10", None, "bf16"),
    ("NVIDIA A10G", None, "bf16"),
    ("NVIDIA A30", None, "bf16"),
    ("NVIDIA A40", None, "bf16"),
    ("NVIDIA L4", None, "bf16"),
    ("NVIDIA L40", None, "bf16"),
    ("NVIDIA L40S", None, "bf16"),
    ("NVIDIA GeForce RTX 4090", (8, 9), "bf16"),
    ("NVIDIA GeForce RTX 3090", None, "bf16"),
    ("NVIDIA RTX A6000", None, "bf16"),
    ("NVIDIA RTX 6000 Ada Generation", None, "bf16"),
    ("NVIDIA B200", None, "bf16"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), "bf16"),
    ("Orin", (8, 7), "bf16"),
    ("Jetson AGX Orin", None, "bf16"),
    ("Quadro RTX 6000", None, "fp16"),
    ("Quadro RTX 6000", (7, 5), "fp16"),
    ("Tesla V100-SXM2-16GB", (7, 0), "fp16"),
    ("Tesla V100-PCIE-32GB", None, "fp16"),
    ("NVIDIA TITAN V", None, "fp16"),
    ("TITAN RTX", None, "fp16"),
    ("Tesla T4", (7, 5), "fp16"),
    ("Tesla T4", None, "fp16"),
    ("NVIDIA GeForce RTX 2080 Ti", (7, 5), "fp16"),
    ("Xavier", (7, 2), "fp16"),
    ("Jetson Xavier NX", None, "fp16"),
    ("NVIDIA GeForce GTX 1660 Ti", (7, 5), "fp32"),
    ("NVIDIA GeForce GTX 1650", None, "fp32"),
    ("NVIDIA T1000", (7, 5), "fp32"),
    ("NVIDIA T400 4GB", None, "fp32"),
    ("NVIDIA GeForce MX450", (7, 5), "fp32"),
    ("NVIDIA GeForce GTX 1080", (6, 1), "fp32"),
    ("Tesla P100-PCIE-16GB", (6, 0), "fp32"),
    ("Tesla P100-PCIE-16GB", None, "fp32"),
    ("Tesla K80", (3, 7), "fp32"),
    ("NVIDIA Tegra X2", None, "fp32"),
    ("NVIDIA Jetson Nano", None, "fp32"),
    ("GeForce GTX TITAN X", None, "fp32"),
    ("Some Future GPU", (10, 3), "bf16"),
    ("Some Unknown GPU", None, "fp32"),
    ("cpu", None, "fp32"),
]


@pytest.mark.parametrize(("name", "capability", "expected"), AUTO_CASES)
def test_auto_precision_over_real_devices(
    name: str, capability: tuple[int, int] | None, expected: str
) -> None:
    plan = select_precision(name, capability)
    assert plan.mode == expected, plan.reason
    assert plan.dtype == {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[expected]
    assert plan.use_grad_scaler == (expected == "fp16")
    assert plan.autocast_enabled == (expected != "fp32")
    assert plan.device_type == ("cpu" if name == "cpu" else "cuda")


# Name-only detection (no capability reported) over the current Blackwell, Hopper and Ada product lists, by the
# compute capability NVIDIA's table gives each part: every one must resolve to bf16 with the right capability.
CURRENT_PARTS = [
    ("NVIDIA B100", (10, 0)),
    ("NVIDIA B200", (10, 0)),
    ("NVIDIA GB200", (10, 0)),
    ("NVIDIA B300 SXM6 AC", (10, 3)),
    ("NVIDIA GB300", (10, 3)),
    ("NVIDIA GB10", (12, 1)),  # DGX Spark
    ("NVIDIA Thor", (11, 0)),  # Jetson AGX Thor
    ("NVIDIA Jetson T5000", (11, 0)),
    ("NVIDIA Jetson T4000", (11, 0)),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", (12, 0)),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", (12, 0)),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0)),
    ("NVIDIA RTX PRO 6000", (12, 0)),  # without the generation word
    ("NVIDIA RTX PRO 5000 Blackwell", (12, 0)),
    ("NVIDIA RTX PRO 4500 Blackwell", (12, 0)),
    ("NVIDIA RTX PRO 4500 Blackwell Server Edition", (12, 0)),
    ("NVIDIA RTX PRO 4000 Blackwell", (12, 0)),
    ("NVIDIA RTX PRO 4000 Blackwell SFF Edition", (12, 0)),
    ("NVIDIA RTX PRO 2000 Blackwell", (12, 0)),
    ("NVIDIA RTX PRO 5000 Blackwell Generation Laptop GPU", (12, 0)),
    ("NVIDIA RTX PRO 500 Blackwell Generation Laptop GPU", (12, 0)),
    ("NVIDIA GeForce RTX 5090", (12, 0)),
    ("NVIDIA GeForce RTX 5090 D", (12, 0)),
    ("NVIDIA GeForce RTX 5080", (12, 0)),
    ("NVIDIA GeForce RTX 5070 Ti", (12, 0)),
    ("NVIDIA GeForce RTX 5060 Ti", (12, 0)),
    ("NVIDIA GeForce RTX 5050", (12, 0)),
    ("NVIDIA GeForce RTX 5090 Laptop GPU", (12, 0)),
    ("NVIDIA GeForce RTX 5070 Laptop GPU", (12, 0)),
    ("NVIDIA GeForce RTX 5050 Laptop GPU", (12, 0)),
    ("NVIDIA H200 NVL", (9, 0)),
    ("NVIDIA H100 NVL", (9, 0)),
    ("NVIDIA H800", (9, 0)),
    ("NVIDIA H800 PCIe", (9, 0)),
    ("NVIDIA H20", (9, 0)),
    ("NVIDIA L20", (8, 9)),
    ("NVIDIA L2", (8, 9)),
    ("NVIDIA RTX 4000 SFF Ada Generation", (8, 9)),
    ("NVIDIA A800 80GB PCIe", (8, 0)),
]


@pytest.mark.parametrize(("name", "capability"), CURRENT_PARTS)
def test_name_only_detection_of_current_parts(name: str, capability: tuple[int, int]) -> None:
    plan = select_precision(name, None)
    assert plan.mode == "bf16", plan.reason
    assert plan.capability == capability
    assert "name table" in plan.reason


def test_new_name_rules_do_not_capture_older_parts() -> None:
    # "RTX PRO" is Blackwell-only branding; "Quadro RTX 6000" stays Turing, and a Turing "T1000" is no Thor.
    assert lookup_gpu("Quadro RTX 6000").capability == (7, 5)
    assert lookup_gpu("NVIDIA T1000").capability == (7, 5)
    assert lookup_gpu("NVIDIA RTX 6000 Ada Generation").capability == (8, 9)
    assert lookup_gpu("NVIDIA GeForce RTX 4090").capability == (8, 9)
    assert lookup_gpu("Jetson Orin Nano").capability == (8, 7)


@pytest.mark.parametrize(
    ("name", "family_word", "capability"),
    [
        ("NVIDIA A100-PCIE-40GB", "GA100", (8, 0)),
        ("NVIDIA A10", "Ampere", (8, 6)),
        ("NVIDIA L40S", "Ada", (8, 9)),
        ("NVIDIA L4", "Ada", (8, 9)),
        ("NVIDIA H200", "Hopper", (9, 0)),
        ("NVIDIA H20", "Hopper", (9, 0)),
        ("NVIDIA RTX 6000 Ada Generation", "Ada", (8, 9)),
        ("Quadro RTX 6000", "Turing", (7, 5)),
        ("NVIDIA RTX A6000", "Ampere", (8, 6)),
        ("Jetson Orin Nano", "Orin", (8, 7)),
        ("NVIDIA GeForce GTX TITAN X", "Maxwell", (5, 2)),
        ("NVIDIA TITAN Xp", "Pascal", (6, 1)),
    ],
)
def test_name_table_order_resolves_prefix_collisions(name: str, family_word: str, capability: tuple) -> None:
    info = lookup_gpu(name)
    assert info is not None
    assert family_word in info.family
    assert info.capability == capability


def test_mig_slice_resolves_as_parent_and_says_so() -> None:
    plan = select_precision("NVIDIA A100-SXM4-80GB MIG 3g.40gb", None)
    assert plan.mode == "bf16"
    assert "MIG" in plan.reason
    assert plan.capability == (8, 0)


def test_reported_capability_beats_name_table() -> None:
    # A name the table places on Turing, but the driver reports Ampere: the hardware's answer wins.
    assert select_precision("Tesla T4", (8, 0)).mode == "bf16"
    assert "reported capability" in select_precision("Tesla T4", (7, 5)).reason


@pytest.mark.parametrize(
    ("name", "capability", "override", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", (9, 0), "fp16", "fp16"),
        ("NVIDIA H100 80GB HBM3", (9, 0), "fp32", "fp32"),
        ("NVIDIA A100-SXM4-80GB", None, "bf16", "bf16"),
        ("Tesla T4", (7, 5), "fp32", "fp32"),
        ("NVIDIA GeForce GTX 1660 Ti", (7, 5), "fp16", "fp16"),  # fast fp16, just no tensor cores
        ("Tesla P100-PCIE-16GB", (6, 0), "fp16", "fp16"),  # GP100 has double-rate fp16
        ("NVIDIA GeForce GTX 1080", (6, 1), "fp32", "fp32"),
        ("cpu", None, "bf16", "bf16"),
        ("cpu", None, "fp32", "fp32"),
        ("cpu", None, " AUTO ", "fp32"),
    ],
)
def test_possible_overrides_are_honoured(name: str, capability, override: str, expected: str) -> None:
    plan = select_precision(name, capability, override)
    assert plan.mode == expected
    assert plan.use_grad_scaler == (expected == "fp16")


@pytest.mark.parametrize(
    ("name", "capability", "override", "fragment"),
    [
        ("Tesla T4", (7, 5), "bf16", "Ampere"),
        ("Tesla V100-SXM2-16GB", None, "bf16", "8.0"),
        ("NVIDIA GeForce GTX 1080", (6, 1), "fp16", "fast fp16"),
        ("Tesla K80", None, "fp16", "fast fp16"),
        ("cpu", None, "fp16", "cpu"),
        ("Some Unknown GPU", None, "bf16", "unknown"),
        ("NVIDIA H100 80GB HBM3", (9, 0), "float16", "auto"),
        ("cpu", None, "mixed", "bf16"),
    ],
)
def test_impossible_overrides_raise_naming_the_setting(
    name: str, capability, override: str, fragment: str
) -> None:
    with pytest.raises(PrecisionError) as caught:
        select_precision(name, capability, override)
    message = str(caught.value)
    assert "training.precision" in message
    assert fragment in message
    assert "\n" not in message
    assert isinstance(caught.value, ValueError)


def test_plan_to_dict_is_json_safe() -> None:
    plan = select_precision("Tesla T4", (7, 5))
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["mode"] == "fp16"
    assert data["dtype"] == "float16"
    assert data["use_grad_scaler"] is True
    assert data["capability"] == [7, 5]


def test_detect_precision_cpu_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gpu_utils.precision"):
        plan = detect_precision("cpu")
    assert plan.mode == "fp32"
    assert plan.device_type == "cpu"
    assert any("fp32" in record.getMessage() for record in caplog.records)
    assert detect_precision(torch.device("cpu"), "bf16").mode == "bf16"


def test_detect_precision_reads_cuda_name_and_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Tesla V100-SXM2-16GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 0))
    # is_bf16_supported would say True here (emulation); the plan must ignore it.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    plan = detect_precision("cuda:0")
    assert plan.mode == "fp16"
    assert plan.device_type == "cuda"
    with pytest.raises(PrecisionError, match=r"training\.precision"):
        detect_precision("cuda:0", "bf16")


# ----------------------------------------------------------------------------------------------------------
# OptimStep on CPU
# ----------------------------------------------------------------------------------------------------------


def _cpu_plan(mode: str) -> PrecisionPlan:
    """fp32/bf16 come from select_precision; fp16 on CPU is built by hand to exercise the GradScaler path."""
    if mode == "fp16":
        return PrecisionPlan("fp16", torch.float16, True, "test: fp16 on cpu", "cpu")
    return select_precision("cpu", None, mode)


def _regression(mode: str, fused: bool, steps: int = 60) -> tuple[list[float], OptimStep, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    plan = _cpu_plan(mode)
    optimizer = make_optimizer(model.parameters(), 1e-2, plan, "cpu", fused=fused)
    stepper = OptimStep(optimizer, plan, max_grad_norm=5.0)
    x = torch.randn(256, 4)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1
    losses, norms = [], []
    for _ in range(steps):
        with stepper.autocast():
            prediction = model(x)
        loss = torch.nn.functional.mse_loss(prediction.float().squeeze(-1), y)
        norms.append(stepper.step(loss))
        losses.append(loss.detach())
    return [float(v) for v in losses], stepper, norms


def test_bf16_autocast_runs_on_cpu() -> None:
    stepper = OptimStep(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), _cpu_plan("bf16"))
    layer = torch.nn.Linear(8, 8)
    with stepper.autocast():
        activation = layer(torch.randn(2, 8))
    assert activation.dtype == torch.bfloat16
    assert layer(torch.randn(2, 8)).dtype == torch.float32  # autocast ends with the block


def test_fp32_autocast_is_a_no_op() -> None:
    stepper = OptimStep(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), _cpu_plan("fp32"))
    with stepper.autocast():
        assert not torch.is_autocast_enabled("cpu")
        assert torch.nn.Linear(8, 8)(torch.randn(2, 8)).dtype == torch.float32


@pytest.mark.parametrize("mode", ["fp32", "bf16", "fp16"])
def test_optim_step_trains_a_tiny_regression(mode: str) -> None:
    losses, stepper, norms = _regression(mode, fused=True)
    assert losses[-1] < 0.2 * losses[0]
    assert all(isinstance(n, torch.Tensor) and n.dim() == 0 and not n.requires_grad for n in norms)
    assert (stepper.scaler is not None) == (mode == "fp16")
    assert all(p.grad is None for p in stepper.params)  # zero_grad(set_to_none=True)


def test_fused_step_is_sync_free_and_nonfused_scaler_syncs_every_step() -> None:
    """Why make_optimizer asks for fused Adam: GradScaler + non-fused optimizer reads found_inf each step."""
    with SyncCounter(count_cpu=True) as fused_count:
        _regression("fp16", fused=True, steps=20)
    with SyncCounter(count_cpu=True) as foreach_count:
        _regression("fp16", fused=False, steps=20)
    with SyncCounter(count_cpu=True) as bf16_count:
        _regression("bf16", fused=False, steps=20)
    # Only the test's own float(loss) conversions at the end (one per step) are counted.
    assert fused_count.by_kind == {"float": 20}
    assert bf16_count.by_kind == {"float": 20}
    assert foreach_count.by_kind == {"float": 20, "item": 20}


def test_grad_scaler_skips_an_overflowing_step() -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    plan = _cpu_plan("fp16")
    stepper = OptimStep(make_optimizer([weight], 0.1, plan, "cpu", fused=True), plan, max_grad_norm=1.0)
    scale_before = stepper.scaler.get_scale()
    norm = stepper.step((weight * torch.tensor([float("inf"), 1.0, 1.0])).sum())
    assert torch.equal(weight.detach(), torch.ones(3))  # step skipped
    assert not torch.isfinite(norm)
    assert stepper.scaler.get_scale() < scale_before  # and the scale backed off
    stepper.step((weight * 2).sum())
    assert not torch.equal(weight.detach(), torch.ones(3))  # the next finite step applies


def test_clipping_bounds_the_update_and_returns_preclip_norm() -> None:
    weight = torch.nn.Parameter(torch.zeros(4))
    stepper = OptimStep(torch.optim.SGD([weight], lr=1.0), _cpu_plan("fp32"), max_grad_norm=1.0)
    norm = stepper.step((weight * torch.tensor([30.0, 40.0, 0.0, 0.0])).sum())
    assert norm.item() == pytest.approx(50.0)
    assert torch.linalg.vector_norm(weight.detach()).item() == pytest.approx(1.0, rel=1e-5)


def test_step_refuses_a_low_precision_loss() -> None:
    weight = torch.nn.Parameter(torch.ones(2))
    stepper = OptimStep(torch.optim.SGD([weight], lr=0.1), _cpu_plan("bf16"))
    with pytest.raises(ValueError, match=r"\.float\(\)"):
        stepper.step((weight.to(torch.bfloat16) * 2).sum())


def test_make_optimizer_kernel_choice() -> None:
    params = [torch.nn.Parameter(torch.zeros(3))]
    plan = _cpu_plan("fp32")
    assert make_optimizer(params, 1e-3, plan, "cpu").defaults["foreach"] is True
    assert make_optimizer(params, 1e-3, plan, "cpu").defaults["fused"] is None
    assert make_optimizer(params, 1e-3, plan, "cpu", fused=True).defaults["fused"] is True
    # fused=None on a CUDA plan asks for fused; for parameters fused cannot handle it falls back to foreach.
    fallback = make_optimizer(
        [torch.nn.Parameter(torch.zeros(3, dtype=torch.int64), requires_grad=False)], 1e-3, plan, "cuda"
    )
    assert fallback.defaults["foreach"] is True
