"""Choose a training precision (bf16 / fp16 / fp32) from what the device can really do.

The choice is a pure function of the device name and CUDA compute capability, so every rule can be tested
without a GPU; ``detect_precision`` only reads those two facts from torch and hands them over.
``torch.cuda.is_bf16_supported()`` is deliberately not consulted: it answers True on T4/V100, where bf16 runs
through slow emulation rather than tensor cores.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

__all__ = [
    "OVERRIDE_KEY",
    "PrecisionError",
    "PrecisionMode",
    "PrecisionPlan",
    "detect_precision",
    "lookup_gpu",
    "resolve_precision",
    "select_precision",
]

log = logging.getLogger(__name__)

PrecisionMode = Literal["bf16", "fp16", "fp32"]
OVERRIDE_KEY = "training.precision"
_OVERRIDES = ("auto", "bf16", "fp16", "fp32")
_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# Parts with native fast (double-rate) fp16 arithmetic but no tensor cores: GP100, Tegra X1/X2.
_FAST_FP16_WITHOUT_TENSOR_CORES = {(5, 3), (6, 0), (6, 2)}


class PrecisionError(ValueError):
    """A precision the device cannot run (or an unknown precision name) was requested."""


@dataclass(frozen=True)
class PrecisionPlan:
    """How a trainer runs its forward/backward passes on one device."""

    mode: PrecisionMode
    dtype: torch.dtype
    use_grad_scaler: bool
    reason: str
    device_type: str
    device_name: str = ""
    capability: tuple[int, int] | None = None

    @property
    def autocast_enabled(self) -> bool:
        """True when forward passes run under ``torch.autocast`` (bf16 or fp16)."""
        return self.mode != "fp32"

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Forward-pass context: ``torch.autocast`` with the plan's dtype, or nothing at all for fp32."""
        if not self.autocast_enabled:
            yield
            return
        with torch.autocast(device_type=self.device_type, dtype=self.dtype):
            yield

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe summary for run manifests and reports."""
        return {
            "mode": self.mode,
            "dtype": str(self.dtype).removeprefix("torch."),
            "use_grad_scaler": self.use_grad_scaler,
            "autocast_enabled": self.autocast_enabled,
            "reason": self.reason,
            "device_type": self.device_type,
            "device_name": self.device_name,
            "capability": list(self.capability) if self.capability is not None else None,
        }


@dataclass(frozen=True)
class GpuInfo:
    """What the name table knows about one GPU family."""

    family: str
    capability: tuple[int, int]
    tensor_cores: bool


def _entry(
    pattern: str, family: str, capability: tuple[int, int], tensor_cores: bool | None = None
) -> tuple[re.Pattern[str], GpuInfo]:
    # Every part from Volta (7.0) on has tensor cores except the Turing parts listed explicitly with False.
    cores = capability >= (7, 0) if tensor_cores is None else tensor_cores
    return re.compile(pattern), GpuInfo(family, capability, cores)


# Ordered: the first match wins, so longer/more specific names come before their prefixes
# (A100 before A10, L40S before L40 before L4, H200/GH200 before H20, "RTX 6000 Ada" before "Quadro RTX 6000").
# Patterns run on the lower-cased name with "nvidia"/"geforce"/"tesla" removed and whitespace collapsed.
_GPU_TABLE: tuple[tuple[re.Pattern[str], GpuInfo], ...] = (
    # Jetson / Tegra first: "orin nano" must not fall through to the Maxwell "nano" entry.
    _entry(r"\bthor\b|\bjetson t[45]000\b", "Jetson Thor (Blackwell)", (11, 0)),
    _entry(r"\borin\b", "Jetson Orin (Ampere)", (8, 7)),
    _entry(r"\bxavier\b", "Jetson Xavier (Volta)", (7, 2)),
    _entry(r"\btx2\b|\btegra x2\b", "Jetson TX2 (Pascal)", (6, 2)),
    _entry(r"\bnano\b|\btx1\b|\btegra x1\b", "Jetson Nano/TX1 (Maxwell)", (5, 3)),
    # Blackwell (NVIDIA's compute-capability table): B300/GB300 are sm_103, B100/B200/GB200 sm_100, GB10
    # (DGX Spark) sm_121, every "RTX PRO" part and GeForce RTX 50xx (desktop and laptop) sm_120.
    _entry(r"\bg?b300\b", "Blackwell Ultra datacenter", (10, 3)),
    _entry(r"\bgb[12]00\b|\bb[12]00\b", "Blackwell datacenter", (10, 0)),
    _entry(r"\bgb10\b|\bdgx spark\b", "Blackwell GB10 (DGX Spark)", (12, 1)),
    _entry(r"\bblackwell\b|\brtx pro \d{3,4}\b|\brtx 50\d0\b", "Blackwell workstation/consumer", (12, 0)),
    # Hopper.
    _entry(r"\bgh200\b|\bh200\b|\bh100\b|\bh800\b|\bh20\b", "Hopper", (9, 0)),
    # Ada.
    _entry(r"\brtx \d{4} ada\b|\bada generation\b", "Ada workstation", (8, 9)),
    _entry(r"\bl40s\b|\bl40\b|\bl20\b|\bl4\b|\bl2\b|\brtx 40\d0\b", "Ada", (8, 9)),
    # Ampere.
    _entry(r"\ba100\b|\ba800\b|\ba30\b", "Ampere GA100", (8, 0)),
    _entry(r"\ba10g\b|\ba10\b|\ba40\b|\ba16\b|\ba2\b|\brtx a\d{3,4}\b|\brtx 30\d0\b", "Ampere", (8, 6)),
    # Turing with tensor cores.
    _entry(r"\bquadro rtx \d{4}\b|\btitan rtx\b|\brtx 20\d0\b|\bt4\b", "Turing", (7, 5), True),
    # Turing without tensor cores (TU116/TU117): fast fp16 but no HMMA units.
    _entry(r"\bgtx 16\d0\b", "Turing GTX 16xx (no tensor cores)", (7, 5), False),
    _entry(r"\bt(?:400|500|550|600|1000|1200|2000)\b", "Turing T-series (no tensor cores)", (7, 5), False),
    _entry(r"\bmx ?[45]\d0\b", "Turing MX (no tensor cores)", (7, 5), False),
    # Volta.
    _entry(r"\bv100\b|\btitan v\b|\bquadro gv100\b", "Volta", (7, 0)),
    # "GTX TITAN X" is Maxwell; it must win over the Pascal "TITAN X"/"TITAN Xp" entry below.
    _entry(r"\bgtx titan x\b", "Maxwell", (5, 2)),
    # Pascal: GP100 has fast fp16, the rest (6.1) run fp16 at 1/64 rate.
    _entry(r"\bp100\b|\bquadro gp100\b", "Pascal GP100", (6, 0)),
    _entry(r"\bp40\b|\bp4\b|\bp6\b|\bgtx 10\d0\b|\btitan xp?\b|\bquadro p\d{3,4}\b", "Pascal", (6, 1)),
    # Maxwell and Kepler.
    _entry(r"\bm40\b|\bm60\b|\bm10\b|\bgtx 9\d0\b", "Maxwell", (5, 2)),
    _entry(r"\bk80\b", "Kepler GK210", (3, 7)),
    _entry(r"\bk40\b|\bk20\b|\bk10\b|\bgtx 7\d0\b", "Kepler", (3, 5)),
)

_MIG_SUFFIX = re.compile(r"\s+mig\b.*$")
_VENDOR_WORDS = re.compile(r"\b(?:nvidia|geforce|tesla)\b")


def _normalise_name(device_name: str) -> tuple[str, bool]:
    """Lower-case, drop vendor words and a MIG slice suffix; report whether the name was a MIG slice."""
    name = " ".join(device_name.lower().split())
    is_mig = bool(_MIG_SUFFIX.search(name))
    name = _MIG_SUFFIX.sub("", name)
    name = " ".join(_VENDOR_WORDS.sub(" ", name).split())
    return name, is_mig


def lookup_gpu(device_name: str) -> GpuInfo | None:
    """The name-table entry for a CUDA device name (MIG slices resolve to their parent GPU), or None."""
    name, _ = _normalise_name(device_name)
    for pattern, info in _GPU_TABLE:
        if pattern.search(name):
            return info
    return None


def _plan(
    mode: PrecisionMode, reason: str, device_type: str, name: str, capability: tuple[int, int] | None
) -> PrecisionPlan:
    return PrecisionPlan(
        mode=mode,
        dtype=_DTYPES[mode],
        use_grad_scaler=mode == "fp16",
        reason=reason,
        device_type=device_type,
        device_name=name,
        capability=capability,
    )


def _refuse(override: str, device: str, why: str) -> PrecisionError:
    return PrecisionError(
        f"{OVERRIDE_KEY}={override!r} cannot run on {device}: {why}; use 'auto' or 'fp32' instead"
    )


def _check_override(override: str) -> str:
    value = str(override).strip().lower()
    if value not in _OVERRIDES:
        raise PrecisionError(f"{OVERRIDE_KEY}={override!r} is not one of {', '.join(_OVERRIDES)}")
    return value


def _infer_device_type(device_name: str) -> str:
    return "cpu" if device_name.strip().lower() in ("", "cpu") else "cuda"


def select_precision(
    device_name: str,
    capability: tuple[int, int] | None,
    override: str = "auto",
    *,
    device_type: str | None = None,
) -> PrecisionPlan:
    """Pick bf16 / fp16 / fp32 for a device from its name and compute capability (pure, no GPU needed).

    ``device_type`` defaults to "cpu" for the name "cpu" (or empty) and "cuda" otherwise. ``override`` is the
    ``training.precision`` setting: "auto" applies the rules, anything else is honoured only if the device can
    run it natively, otherwise ``PrecisionError`` is raised.
    """
    override = _check_override(override)
    kind = (device_type or _infer_device_type(device_name)).lower()

    if kind == "cpu":
        if override == "fp16":
            raise _refuse(
                override, "cpu", "CPU fp16 has no fast kernels and would need a GradScaler (use 'bf16')"
            )
        if override == "bf16":
            return _plan("bf16", "cpu: bf16 autocast requested by training.precision", "cpu", "cpu", None)
        return _plan("fp32", "cpu: fp32 (bf16 only on request via training.precision)", "cpu", "cpu", None)

    if kind != "cuda":
        if override in ("bf16", "fp16"):
            raise _refuse(
                override, f"{kind} device {device_name!r}", "mixed precision is only planned for CUDA"
            )
        return _plan("fp32", f"{kind}: fp32 (mixed precision only planned for CUDA)", kind, device_name, None)

    info = lookup_gpu(device_name)
    _, is_mig = _normalise_name(device_name)
    cap = tuple(capability) if capability is not None else (info.capability if info else None)
    source = "reported capability" if capability is not None else "name table"
    described = f"{device_name!r}" + (f" (compute capability {cap[0]}.{cap[1]})" if cap else "")
    if cap is None:
        if override in ("bf16", "fp16"):
            raise _refuse(override, described, "unknown GPU without a reported compute capability")
        return _plan(
            "fp32", f"{device_name}: unknown GPU, capability unavailable -> fp32", "cuda", device_name, None
        )

    cap = (int(cap[0]), int(cap[1]))
    # 7.5 is ambiguous (RTX/T4 have tensor cores, GTX 16xx/T1000/MX do not): only the name can tell.
    if cap[0] == 7 and info is not None and info.capability[0] == 7:
        tensor_cores = info.tensor_cores
    else:
        tensor_cores = cap >= (7, 0)
    bf16_native = cap >= (8, 0)
    fast_fp16 = cap >= (7, 0) or cap in _FAST_FP16_WITHOUT_TENSOR_CORES
    family = info.family if info else "unlisted GPU"
    where = f"{device_name} [{family}, sm_{cap[0]}{cap[1]} from {source}{', MIG slice' if is_mig else ''}]"

    if override == "fp32":
        return _plan("fp32", f"{where}: fp32 requested by training.precision", "cuda", device_name, cap)
    if override == "bf16":
        if not bf16_native:
            raise _refuse(override, described, "bf16 needs compute capability >= 8.0 (Ampere or newer)")
        return _plan("bf16", f"{where}: bf16 requested by training.precision", "cuda", device_name, cap)
    if override == "fp16":
        if not fast_fp16:
            raise _refuse(override, described, "this GPU has no fast fp16 arithmetic")
        return _plan(
            "fp16", f"{where}: fp16 + GradScaler requested by training.precision", "cuda", device_name, cap
        )

    if bf16_native:
        return _plan("bf16", f"{where}: bf16 tensor cores", "cuda", device_name, cap)
    if tensor_cores:
        return _plan(
            "fp16",
            f"{where}: fp16 tensor cores, no native bf16 -> fp16 + GradScaler",
            "cuda",
            device_name,
            cap,
        )
    return _plan("fp32", f"{where}: no tensor cores -> fp32", "cuda", device_name, cap)


def detect_precision(device: torch.device | str, override: str = "auto") -> PrecisionPlan:
    """Read the real device's name and capability, choose a plan with ``select_precision`` and log it."""
    dev = torch.device(device)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        capability = tuple(torch.cuda.get_device_capability(index))
        plan = select_precision(name, capability, override, device_type="cuda")  # type: ignore[arg-type]
    elif dev.type == "cpu":
        plan = select_precision("cpu", None, override, device_type="cpu")
    else:
        plan = select_precision(str(dev), None, override, device_type=dev.type)
    log.info("precision %s on %s: %s", plan.mode, dev, plan.reason)
    return plan


def resolve_precision(precision: PrecisionPlan | str, device: torch.device | str) -> PrecisionPlan:
    """A ready plan (checked against ``device``), or ``detect_precision(device, precision)`` for an override string."""
    dev = torch.device(device)
    if isinstance(precision, PrecisionPlan):
        if precision.device_type != dev.type:
            raise PrecisionError(
                f"{OVERRIDE_KEY}: plan is for {precision.device_type!r}, training runs on {dev.type!r}"
            )
        return precision
    return detect_precision(dev, precision)
