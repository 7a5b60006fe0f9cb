"""The GPU check: one command that measures what the training stack does on a real accelerator.

    python bench/gpu/gpu_check.py --out "$OUT"     # on the GPU machine: about 3 minutes on one H200 (estimated)
    python bench/gpu/gpu_check.py --dry --out DIR  # the same code path on the CPU in seconds (tests/test_gpu_check.py)

Writes ``gpu_check.json`` and ``gpu_check.md`` (a short table) to ``--out`` (default: $OUT if set, else
``results/``) and prints the table. Sections (docs/PERFORMANCE.md, "GPU check"):

  1. precision   - the plan chosen for the device (name, capability, mode, reason) and the dtype a Linear layer
                   really outputs inside the DQN and PPO loss computations (autocast must run bf16 on an H200)
  2. host_syncs  - ``torch.cuda.set_sync_debug_mode("warn")`` warnings counted for DQN and PPO runs whose step
                   loops are doubled between the same number of periodic checks: the doubling must add none
  3. env         - TradingEnv steps/s at N = 1k, 16k, 64k
  4. bf16_vs_fp32- DQN and PPO env steps/s at a GPU-sized batch, both precisions
  5. utilization - NVML GPU utilization and memory sampled on a thread during a 60 s PPO run (target >= 80%)
  6. vram        - HardwareBudget's predicted maximum batch fits under a memory cap of its usable bytes;
                   1.5x of it is predicted not to fit, and whether it really fails (OOM caught) is reported
  7. seeds       - the demo's PPO (hidden 64, 64 envs a seed) with S seeds trained as one batch
                   (``train_seeds``), S up to what the VRAM budget holds: all-seed env steps/s and NVML
                   utilization per S (target >= 80% at the largest S)

It needs only torch and numpy (plus nvidia-ml-py for section 5): the environment's data are synthetic arrays
given to ``MarketData.from_arrays`` (or its dataclass fields), no polars frame. Every section runs inside its
own error guard, so one failure is reported in the JSON and the others still run; the report is rewritten
after every section. ``--dry`` (or ``--quick``, as every bench script calls it) uses tiny sizes and ~1 s durations;
the NVML and sync-debug parts then report "skipped: no CUDA" while the code around them (training runs,
sampler thread, CPU sync counting with ``gpu_utils.SyncCounter``) still runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as `python bench/gpu/gpu_check.py` without an installed package
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402  (after the path set-up, like every import below)
import torch  # noqa: E402

SKIPPED_NO_CUDA = "skipped: no CUDA"
SYNC_WARNING = "synchroniz"  # torch's sync-debug text: "called a synchronizing CUDA operation"
UTILIZATION_TARGET = 80.0  # percent, mean over the training run
VRAM_OVERSHOOT = 1.5


@dataclass(frozen=True)
class Sizes:
    """Every size and duration of one check run (``FULL`` on the GPU, ``DRY`` on the CPU)."""

    rows: int  # synthetic bars
    features: int
    episode_length: int
    env_ns: tuple[int, ...]
    env_seconds: float
    sync_n_envs: int
    sync_dqn_vector_steps: int  # the short run; the long run doubles it
    sync_windows: int  # periodic checks in both runs
    sync_ppo_n_steps: int  # the short run's rollout length; the long run doubles it
    sync_ppo_updates: int
    dqn: dict[str, Any]  # n_envs and hyperparameters of the GPU-sized DQN
    ppo: dict[str, Any]
    speed_seconds: float  # per measured training run of section 4
    train_seconds: float  # section 5
    sample_interval: float
    vram_hidden: int
    vram_replay: int
    seeds: tuple[int, ...] = (1, 16, 64, 256)  # section 7: S values (capped by the VRAM budget)
    seeds_spec: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {
            "n_envs": 64,
            "hparams": {"n_steps": 64, "batch_size": 1024, "n_epochs": 4, "hidden_dim_base": 64},
        }
    )
    seeds_seconds: float = 12.0
    gae_columns: tuple[int, ...] = (256, 1_024, 2_048, 4_096, 16_384, 65_536, 262_144)  # section 8: S·N
    gae_repeats: int = 9
    capture_seeds: int = 16  # section 9
    folds: int = (
        12  # section 10: a year of 20-day test folds, on the batch axis with capture_seeds seeds each
    )
    folds_seconds: float = 12.0
    capture_dqn_hparams: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {
            "batch_size": 256,
            "buffer_size": 100_000,
            "learning_starts": 4_096,
            "hidden_dim_base": 64,
        }
    )


FULL = Sizes(
    rows=1_000_000,
    features=51,
    episode_length=256,
    env_ns=(1_024, 16_384, 65_536),
    env_seconds=3.0,
    sync_n_envs=1_024,
    sync_dqn_vector_steps=200,
    sync_windows=4,
    sync_ppo_n_steps=16,
    sync_ppo_updates=3,
    dqn={
        "n_envs": 4_096,
        "hparams": {
            "batch_size": 8_192,
            "buffer_size": 1_000_000,
            "learning_starts": 8_192,
            "gradient_steps": 1,
            "hidden_dim_base": 512,
        },
    },
    ppo={
        "n_envs": 16_384,
        "hparams": {"n_steps": 32, "batch_size": 32_768, "n_epochs": 4, "hidden_dim_base": 512},
    },
    speed_seconds=8.0,
    train_seconds=60.0,
    sample_interval=0.1,
    vram_hidden=512,
    vram_replay=1_000_000,
)
DRY = Sizes(
    rows=20_000,
    features=8,
    episode_length=64,
    env_ns=(16, 64, 256),
    env_seconds=0.2,
    sync_n_envs=8,
    sync_dqn_vector_steps=40,
    sync_windows=2,
    sync_ppo_n_steps=8,
    sync_ppo_updates=2,
    dqn={
        "n_envs": 16,
        "hparams": {
            "batch_size": 64,
            "buffer_size": 4_096,
            "learning_starts": 64,
            "gradient_steps": 1,
            "hidden_dim_base": 16,
        },
    },
    ppo={"n_envs": 16, "hparams": {"n_steps": 16, "batch_size": 64, "n_epochs": 2, "hidden_dim_base": 16}},
    speed_seconds=0.4,
    train_seconds=1.0,
    sample_interval=0.05,
    vram_hidden=16,
    vram_replay=4_096,
    seeds=(1, 2, 4),
    seeds_spec={
        "n_envs": 8,
        "hparams": {"n_steps": 16, "batch_size": 64, "n_epochs": 2, "hidden_dim_base": 16},
    },
    seeds_seconds=0.5,
    gae_columns=(64, 512),
    gae_repeats=2,
    capture_seeds=2,
    folds=2,
    folds_seconds=0.5,
    capture_dqn_hparams={
        "batch_size": 32,
        "buffer_size": 2_048,
        "learning_starts": 64,
        "hidden_dim_base": 16,
    },
)


# ---------------------------------------------------------------------------------------------- lazy imports


@dataclass
class Stack:
    """The project modules a section needs, imported on first use (``load`` raises a one-line reason)."""

    modules: dict[str, ModuleType] = dataclasses.field(default_factory=dict)

    def load(self, name: str) -> ModuleType:
        if name not in self.modules:
            try:
                self.modules[name] = importlib.import_module(name)
            except ImportError as error:  # name the import that failed, e.g. a module the machine lacks
                raise ImportError(f"import {name} failed: {type(error).__name__}: {error}") from error
        return self.modules[name]


STACK = Stack()


def synthetic_market_data(n_rows: int, n_features: int, device: torch.device, seed: int = 0) -> Any:
    """A MarketData of two random-walk instruments of minute bars (one segment each), from numpy, no frame.

    Uses ``MarketData.from_arrays`` (the env package's array constructor) when it exists; otherwise fills the
    dataclass fields the way ``MarketData.from_frame`` does, with a constant 1 bp cost fraction.
    """
    env = STACK.load("marketrl.env")
    rng = np.random.default_rng(seed)
    n_segments = 2
    per = n_rows // n_segments
    n_rows = per * n_segments
    closes = np.concatenate(
        [4000.0 * np.exp(np.cumsum(rng.normal(0.0, 5e-4, per))) for _ in range(n_segments)]
    )
    opens = np.concatenate([[closes[0]], closes[:-1]])
    segment_first = np.arange(n_segments, dtype=np.int64) * per
    opens[segment_first] = closes[segment_first]
    features = np.clip(rng.standard_normal((n_rows, n_features), dtype=np.float32), -5.0, 5.0)
    if hasattr(env.MarketData, "from_arrays"):
        costs = STACK.load("marketrl.instruments.costs").CostModel(
            kind="futures",
            commission_per_contract=1.0,
            half_spread_ticks=0.5,
            tick_size=0.25,
            tick_value=12.5,
        )
        minute_ns = 60 * 10**9
        return env.MarketData.from_arrays(
            features,
            opens=opens,
            closes=closes,
            instrument_id=np.repeat(np.arange(1, n_segments + 1), per),
            ts_event_ns=np.tile(np.arange(per, dtype=np.int64) * minute_ns, n_segments),
            cost_model=costs,
            device=device,
            feature_clip=5.0,
            max_gap=None,
        )
    return _market_data_from_fields(env.MarketData, features, opens, closes, n_segments, device)


def _market_data_from_fields(
    market_data: type,
    features: np.ndarray,
    opens: np.ndarray,
    closes: np.ndarray,
    n_segments: int,
    device: torch.device,
) -> Any:
    """The same data through the dataclass fields (for a marketrl.env without ``from_arrays``)."""
    n_rows = features.shape[0]
    per = n_rows // n_segments
    segment_id = np.repeat(np.arange(n_segments, dtype=np.int64), per)
    segment_first = np.arange(n_segments, dtype=np.int64) * per
    segment_last = segment_first + per - 1
    is_decision = np.ones(n_rows, dtype=bool)
    is_decision[segment_last] = False
    next_open, next_close = np.append(opens[1:], 1.0), np.append(closes[1:], 1.0)

    def f32(values: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(values, dtype=np.float32), device=device)

    values = {
        "obs_table": f32(np.concatenate([features, np.zeros((n_rows, 1), dtype=np.float32)], axis=1)),
        "ret_close_close": f32(np.where(is_decision, next_close / closes - 1.0, 0.0)),
        "ret_close_open": f32(np.where(is_decision, next_open / closes - 1.0, 0.0)),
        "ret_open_close": f32(np.where(is_decision, next_close / next_open - 1.0, 0.0)),
        "cost_close": f32(np.full(n_rows, 1e-4)),
        "cost_next_open": f32(np.where(is_decision, 1e-4, 0.0)),
        "close": torch.as_tensor(closes, device=device),
        "segment_start": torch.as_tensor(np.repeat(segment_first, per), device=device),
        "segment_id": torch.as_tensor(segment_id, device=device),
        "is_decision": torch.as_tensor(is_decision, device=device),
        "segment_first": segment_first,
        "segment_last": segment_last,
        "rows": None,  # host metadata (timestamps, symbols): only evaluation reports need it
        "feature_names": [f"f{j}" for j in range(features.shape[1])],
        "max_gap": None,
        "feature_clip": 5.0,
        "device": device,
    }
    known = {item.name for item in dataclasses.fields(market_data) if not item.name.startswith("_")}
    if known != set(values):
        raise TypeError(
            f"MarketData fields changed: missing here {sorted(known - set(values))}, "
            f"unknown there {sorted(set(values) - known)}"
        )
    return market_data(**values)


# -------------------------------------------------------------------------------------------------- helpers


def synchronize(device: torch.device) -> None:
    """Wait for queued device work before reading the clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def env_config(n_envs: int, sizes: Sizes) -> Any:
    return STACK.load("marketrl.env").EnvConfig(
        n_envs=n_envs, episode_length=sizes.episode_length, max_gap=None
    )


def train(
    algo: str, data: Any, n_envs: int, hparams: dict[str, Any], total_steps: int, **run: Any
) -> dict[str, Any]:
    """One training run of ``marketrl.agents.<algo>.train_seeds`` (one seed); returns its log."""
    module = STACK.load(f"marketrl.agents.{algo}")
    precision, device = run.pop("precision"), run.pop("device")
    config_cls = module.DQNConfig if algo == "dqn" else module.PPOConfig
    config = config_cls(total_steps=total_steps, env=env_config(n_envs, run.pop("sizes")), **run)
    return module.train_seeds(data, config, hparams, precision, device, [0])[0].log


def calibrated_steps(
    algo: str,
    data: Any,
    spec: dict[str, Any],
    seconds: float,
    precision: str,
    device: torch.device,
    sizes: Sizes,
) -> int:
    """Env steps (whole loop iterations) for about ``seconds`` of training loop.

    Two short runs: the first pays the one-off costs (kernel loading, cuBLAS handles, allocator growth), the
    second's loop rate sizes the measured run.
    """
    n_envs, hparams = spec["n_envs"], spec["hparams"]
    unit = n_envs * hparams["n_steps"] if algo == "ppo" else n_envs
    first = hparams.get("learning_starts", 0) + (3 if algo == "ppo" else 20) * unit
    rate = 0.0
    for _ in range(2):
        log = train(algo, data, n_envs, hparams, first, precision=precision, device=device, sizes=sizes)
        rate = log["steps_per_second"]
    return max(2 * unit, int(rate * seconds) // unit * unit)


def timed_training(
    algo: str,
    data: Any,
    spec: dict[str, Any],
    seconds: float,
    precision: str,
    device: torch.device,
    sizes: Sizes,
) -> dict[str, Any]:
    """Calibrate on a short run (also the warm-up), then train for about ``seconds``; the trainer's own clock."""
    n_envs, hparams = spec["n_envs"], spec["hparams"]
    steps = calibrated_steps(algo, data, spec, seconds, precision, device, sizes)
    started = time.perf_counter()
    log = train(algo, data, n_envs, hparams, steps, precision=precision, device=device, sizes=sizes)
    return {
        "env_steps": log["env_steps"],
        "grad_steps": log["grad_steps"],
        "steps_per_second": log["steps_per_second"],
        "wall_s": time.perf_counter() - started,
        "precision": log["precision"]["mode"],
    }


# ------------------------------------------------------------------------------------- 1. precision, autocast


def linear_output_dtypes(module: torch.nn.Module) -> tuple[Counter[str], Callable[[], None]]:
    """Record the dtype of every Linear output of ``module``; returns the counter and a remover."""
    seen: Counter[str] = Counter()
    handles = [
        layer.register_forward_hook(lambda _m, _i, out: seen.update([str(out.dtype).removeprefix("torch.")]))
        for layer in module.modules()
        if isinstance(layer, torch.nn.Linear)
    ]
    return seen, lambda: [handle.remove() for handle in handles]


_MATMULS = {torch.baddbmm, torch.bmm, torch.matmul, torch.nn.functional.linear, torch.addmm, torch.mm}


@contextmanager
def matmul_output_dtypes() -> Iterator[Counter[str]]:
    """Count the output dtype of every matrix product run inside (the trainers' stacked networks call
    ``baddbmm`` on stacked weights, not ``nn.Linear`` modules, so forward hooks would see nothing)."""
    seen: Counter[str] = Counter()

    class Recorder(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in _MATMULS and isinstance(out, torch.Tensor):
                seen.update([str(out.dtype).removeprefix("torch.")])
            return out

    with Recorder():
        yield seen


def autocast_probe(plan: Any, device: torch.device, obs_dim: int) -> dict[str, Any]:
    """One DQN TD-loss step and one PPO loss step of one seed through the trainers' own stacked networks and
    losses, with the dtype of every matrix product recorded (inside the forward passes and the losses)."""
    gpu_utils = STACK.load("gpu_utils")
    dqn, ppo = STACK.load("marketrl.agents.dqn"), STACK.load("marketrl.agents.ppo")
    networks, common = STACK.load("marketrl.agents.networks"), STACK.load("marketrl.agents.common")
    n_actions = STACK.load("marketrl.env").N_ACTIONS
    batch = 64
    result: dict[str, Any] = {}

    def q_network() -> Any:
        built = networks.build_networks(networks.make_architecture("dqn", obs_dim, {"hidden_dim_base": 32}))
        return dqn.StackedQNetwork([built["q"]]).to(device)

    q_net, target = q_network(), q_network().requires_grad_(False)
    stepper = gpu_utils.SeedOptimStep.adam(q_net.parameters(), 1e-3, plan, 10.0, n_seeds=1)
    transitions = dqn.Batch(
        obs=torch.randn(1, batch, obs_dim, device=device),
        actions=torch.randint(0, n_actions, (1, batch), device=device),
        rewards=torch.randn(1, batch, device=device),
        discounts=torch.full((1, batch), 0.99, device=device),
        next_obs=torch.randn(1, batch, obs_dim, device=device),
    )
    with matmul_output_dtypes() as seen:
        loss, _ = dqn.td_loss(q_net, target, transitions, plan, double_q=True)
    stepper.step(loss)
    result["dqn"] = {"linear_output_dtypes": dict(seen), "loss_dtype": str(loss.dtype).removeprefix("torch.")}

    nets = networks.build_networks(networks.make_architecture("ppo", obs_dim, {"hidden_dim_base": 32}))
    policy_net = common.SeedStack([nets["policy"]]).to(device)
    value_net = common.SeedStack([nets["value"]]).to(device)
    hp = ppo.PPOHyperparams()
    params = [*policy_net.parameters(), *value_net.parameters()]
    stepper = gpu_utils.SeedOptimStep.adam(params, 1e-3, plan, 0.5, n_seeds=1)
    minibatch = ppo.Minibatch(
        obs=torch.randn(1, batch, obs_dim, device=device),
        actions=torch.randint(0, n_actions, (1, batch), device=device),
        old_log_probs=torch.full((1, batch), -math.log(n_actions), device=device),
        advantages=torch.randn(1, batch, device=device),
        returns=torch.randn(1, batch, device=device),
        old_values=torch.randn(1, batch, device=device),
    )
    with matmul_output_dtypes() as seen:
        loss, _ = ppo.ppo_loss(policy_net, value_net, minibatch, hp, plan)
    stepper.step(loss)
    result["ppo"] = {"linear_output_dtypes": dict(seen), "loss_dtype": str(loss.dtype).removeprefix("torch.")}
    expected = str(plan.dtype).removeprefix("torch.")
    result["expected_dtype"] = expected
    result["ok"] = all(
        set(part["linear_output_dtypes"]) == {expected} and part["loss_dtype"] == "float32"
        for part in (result["dqn"], result["ppo"])
    )
    return result


def optim_step_probe(plan: Any, device: torch.device, obs_dim: int) -> dict[str, Any]:
    """gpu_utils alone (torch only): a Linear stack's output dtype under ``OptimStep.autocast()``, one step."""
    gpu_utils = STACK.load("gpu_utils")
    net = torch.nn.Sequential(torch.nn.Linear(obs_dim, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)).to(
        device
    )
    stepper = gpu_utils.OptimStep(gpu_utils.make_optimizer(net.parameters(), 1e-3, plan, device), plan, 1.0)
    seen, remove = linear_output_dtypes(net)
    with stepper.autocast():
        out = net(torch.randn(64, obs_dim, device=device))
    stepper.step(out.float().square().mean())
    remove()
    expected = str(plan.dtype).removeprefix("torch.")
    return {"linear_output_dtypes": dict(seen), "expected_dtype": expected, "ok": set(seen) == {expected}}


def section_precision(device: torch.device, sizes: Sizes, dry: bool) -> dict[str, Any]:
    gpu_utils = STACK.load("gpu_utils")
    obs_dim = sizes.features + 1
    plan = gpu_utils.detect_precision(device, "auto")
    out: dict[str, Any] = {
        "plan": plan.to_dict(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    plans = {"auto": plan}
    if device.type == "cpu":  # the CPU plan is fp32; the bf16 override exercises the autocast path as well
        plans["bf16"] = gpu_utils.detect_precision(device, "bf16")
    out["optim_step"] = {name: optim_step_probe(p, device, obs_dim) for name, p in plans.items()}
    # The trainers' own loss code needs marketrl; the plan above is reported even if that import fails.
    try:
        out["trainers"] = {name: autocast_probe(p, device, obs_dim) for name, p in plans.items()}
    except ImportError as error:
        out["status"] = f"error: {type(error).__name__}: {error}"
        out["trainers"] = {}
        out["target_met"] = False
        return out
    probes_ok = all(probe["ok"] for group in ("optim_step", "trainers") for probe in out[group].values())
    if device.type == "cuda":
        native = plan.capability is not None and tuple(plan.capability) >= (8, 0)
        out["target"] = (
            "bf16 on a bf16-native GPU, and every Linear output in the plan's dtype inside the step"
        )
        out["target_met"] = (plan.mode == "bf16" or not native) and probes_ok
    else:
        out["target"] = "fp32 on the CPU; Linear outputs in the plan's dtype (bf16 under the bf16 override)"
        out["target_met"] = plan.mode == "fp32" and probes_ok
    return out


# ------------------------------------------------------------------------------------------- 2. host syncs


@contextmanager
def sync_debug_warnings(device: torch.device) -> Iterator[list[str] | None]:
    """On CUDA: sync-debug mode "warn", yielding the list that receives one call site per sync warning.

    Sites are taken from the stack when the warning is raised: the innermost frame in this repository outside
    ``gpu_utils/sync.py`` (whose SyncCounter wrappers sit between the trainer and torch) and this script.
    Elsewhere yields None.
    """
    if device.type != "cuda":
        yield None
        return
    sites: list[str] = []
    show = warnings.showwarning

    def record(message: Warning | str, *args: Any, **kwargs: Any) -> None:
        if SYNC_WARNING in str(message):
            sites.append(_caller_site())
        else:  # other warnings are shown as usual
            show(message, *args, **kwargs)

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield sites
        finally:
            torch.cuda.set_sync_debug_mode(previous)


def _caller_site() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = Path(frame.filename).resolve()
        if (
            REPO_ROOT in path.parents
            and path != Path(__file__).resolve()
            and path.parts[-2:] != ("gpu_utils", "sync.py")
        ):
            return f"{_short_path(frame.filename)}:{frame.lineno}"
    return "outside the repository"


def count_syncs(run: Callable[[], dict[str, Any]], device: torch.device) -> dict[str, Any]:
    """Run one training with sync-debug warnings (CUDA) and ``gpu_utils.SyncCounter`` counting."""
    gpu_utils = STACK.load("gpu_utils")
    with sync_debug_warnings(device) as sites, gpu_utils.SyncCounter(cuda_sync_debug_mode=None) as counter:
        log = run()
    result: dict[str, Any] = {
        "sync_counter": counter.count,
        "sync_counter_by_kind": dict(counter.by_kind),
        "trainer_host_syncs": log["host_syncs"],
        "env_steps": log["env_steps"],
        "grad_steps": log["grad_steps"],
    }
    if sites is None:
        result["cuda_sync_warnings"] = SKIPPED_NO_CUDA
    else:
        result["cuda_sync_warnings"] = len(sites)
        result["cuda_sync_sites"] = dict(Counter(sites).most_common(12))
    return result


def _short_path(filename: str) -> str:
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        parts = path.parts
        return str(Path(*parts[parts.index("torch") :])) if "torch" in parts else path.name


@dataclass(frozen=True)
class SyncProbe:
    """A trainer run twice: ``long`` has twice the step-loop iterations of ``short`` between the same number
    of periodic checks, so ``long − short`` counts the syncs inside the step loop (target 0)."""

    name: str
    run: Callable[[Any, torch.device, Sizes, bool], dict[str, Any]]


def _dqn_sync_run(data: Any, device: torch.device, sizes: Sizes, long: bool) -> dict[str, Any]:
    factor = 2 if long else 1
    vector_steps = sizes.sync_dqn_vector_steps * factor
    n = sizes.sync_n_envs
    hparams = {"batch_size": 256, "buffer_size": 16 * n, "learning_starts": n, "hidden_dim_base": 64}
    return train(
        "dqn",
        data,
        n,
        hparams,
        vector_steps * n,
        precision="auto",
        device=device,
        sizes=sizes,
        check_every=vector_steps // sizes.sync_windows,  # one gradient step per vector step
    )


def _ppo_sync_run(data: Any, device: torch.device, sizes: Sizes, long: bool) -> dict[str, Any]:
    n_steps = sizes.sync_ppo_n_steps * (2 if long else 1)
    n = sizes.sync_n_envs
    # Four minibatches per epoch in both runs, so only the rollout loop doubles.
    hparams = {"n_steps": n_steps, "batch_size": n_steps * n // 4, "n_epochs": 2, "hidden_dim_base": 64}
    total = sizes.sync_ppo_updates * n_steps * n
    return train("ppo", data, n, hparams, total, precision="auto", device=device, sizes=sizes)


SYNC_PROBES = [SyncProbe("dqn", _dqn_sync_run), SyncProbe("ppo", _ppo_sync_run)]
# The coming zoo torch models register here (a SyncProbe per model, same doubling rule) and in ZOO_TRAINING.
ZOO_SYNC_PROBES: list[SyncProbe] = []


def section_host_syncs(device: torch.device, sizes: Sizes, data: Any, dry: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "mode": "torch.cuda.set_sync_debug_mode('warn')" if device.type == "cuda" else None
    }
    met = True
    for probe in [*SYNC_PROBES, *ZOO_SYNC_PROBES]:
        short = count_syncs(lambda p=probe: p.run(data, device, sizes, False), device)
        long = count_syncs(lambda p=probe: p.run(data, device, sizes, True), device)
        entry: dict[str, Any] = {"short": short, "long": long}
        entry["sync_counter_added_by_doubling"] = long["sync_counter"] - short["sync_counter"]
        if device.type == "cuda":
            added = long["cuda_sync_warnings"] - short["cuda_sync_warnings"]
            entry["cuda_syncs_added_by_doubling"] = added
            met = met and added <= 0
        else:
            entry["cuda_syncs_added_by_doubling"] = SKIPPED_NO_CUDA
            met = met and entry["sync_counter_added_by_doubling"] <= 0
        out[probe.name] = entry
    out["zoo"] = [probe.name for probe in ZOO_SYNC_PROBES] or "no zoo models registered yet"
    out["target"] = "no sync added by doubling the step loop between the same periodic checks"
    out["target_met"] = met
    if device.type != "cuda":
        out["status"] = f"{SKIPPED_NO_CUDA} (sync-debug warnings); SyncCounter counts on the CPU instead"
    return out


# ------------------------------------------------------------------------------------------ 3. env steps/s


def env_steps_per_second(data: Any, n_envs: int, sizes: Sizes, device: torch.device) -> dict[str, Any]:
    env = STACK.load("marketrl.env").TradingEnv(data, env_config(n_envs, sizes), seed=0, device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    pool = torch.randint(0, 3, (64, n_envs), generator=generator, device=device)
    env.reset()

    def run(steps: int) -> float:
        synchronize(device)
        started = time.perf_counter()
        for step in range(steps):
            env.step(pool[step % 64])
        synchronize(device)
        return time.perf_counter() - started

    run(10)  # warm-up
    calibration = 20 / run(20)
    steps = max(20, int(calibration * sizes.env_seconds))
    elapsed = run(steps)
    return {"n_envs": n_envs, "vector_steps": steps, "steps_per_second": steps * n_envs / elapsed}


def section_env(device: torch.device, sizes: Sizes, data: Any, dry: bool) -> dict[str, Any]:
    rows = [env_steps_per_second(data, n, sizes, device) for n in sizes.env_ns]
    return {"rows": data.n_rows, "obs_dim": data.n_features + 1, "results": rows}


# ------------------------------------------------------------------------------------- 4. bf16 vs fp32 speed


def section_bf16_vs_fp32(device: torch.device, sizes: Sizes, data: Any, dry: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for algo, spec in (("dqn", sizes.dqn), ("ppo", sizes.ppo)):
        runs = {
            mode: timed_training(algo, data, spec, sizes.speed_seconds, mode, device, sizes)
            for mode in ("fp32", "bf16")
        }
        out[algo] = {
            "n_envs": spec["n_envs"],
            "hparams": spec["hparams"],
            **runs,
            "bf16_over_fp32": runs["bf16"]["steps_per_second"] / runs["fp32"]["steps_per_second"],
        }
    return out


# ----------------------------------------------------------------------------------- 5. NVML utilization


class Sampler(threading.Thread):
    """Calls ``read()`` every ``interval`` seconds until ``stop()``; keeps (time, values) samples."""

    def __init__(self, read: Callable[[], dict[str, float]], interval: float) -> None:
        super().__init__(daemon=True)
        self.read, self.interval = read, interval
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.samples.append((time.perf_counter(), self.read()))

    def stop(self) -> list[tuple[float, dict[str, float]]]:
        self._stop_event.set()
        self.join()
        return self.samples


def nvml_reader(device: torch.device) -> tuple[Callable[[], dict[str, float]], Callable[[], None]]:
    """NVML utilization (% of time a kernel ran) and memory of the torch device; raises ImportError if absent."""
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    index = device.index if device.index is not None else torch.cuda.current_device()
    handle = None
    bus_id = getattr(torch.cuda.get_device_properties(index), "pci_bus_id", None)
    if bus_id is not None:  # CUDA_VISIBLE_DEVICES may renumber; the PCI address does not
        props = torch.cuda.get_device_properties(index)
        address = f"{getattr(props, 'pci_domain_id', 0):08x}:{bus_id:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
        try:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(address)
        except pynvml.NVMLError:
            handle = None
    if handle is None:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def read() -> dict[str, float]:
        rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return {"gpu_util": float(rates.gpu), "mem_util": float(rates.memory), "mem_used": float(memory.used)}

    return read, pynvml.nvmlShutdown


def cpu_reader() -> Callable[[], dict[str, float]]:
    """Stand-in on the CPU (dry run): this process's CPU time per wall second, in percent."""
    last = [time.perf_counter(), time.process_time()]

    def read() -> dict[str, float]:
        now, cpu = time.perf_counter(), time.process_time()
        share = 100.0 * (cpu - last[1]) / max(now - last[0], 1e-9)
        last[:] = [now, cpu]
        return {"cpu_util": share}

    return read


def summarize(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, "p10": None, "min": None, "max": None}
    ordered = sorted(values)
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "p10": ordered[len(ordered) // 10],
        "min": ordered[0],
        "max": ordered[-1],
    }


def sampled_training(
    algo: str, data: Any, spec: dict[str, Any], device: torch.device, sizes: Sizes
) -> dict[str, Any]:
    """Train ``algo`` for about ``sizes.train_seconds`` while a thread samples utilization."""
    n_envs, hparams = spec["n_envs"], spec["hparams"]
    steps = calibrated_steps(algo, data, spec, sizes.train_seconds, "auto", device, sizes)
    close: Callable[[], None] = lambda: None  # noqa: E731
    if device.type == "cuda":
        read, close = nvml_reader(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        read = cpu_reader()
    sampler = Sampler(read, sizes.sample_interval)
    started = time.perf_counter()
    sampler.start()
    try:
        log = train(algo, data, n_envs, hparams, steps, precision="auto", device=device, sizes=sizes)
    finally:
        samples = sampler.stop()
        close()
    wall = time.perf_counter() - started
    warm = started + min(2.0, 0.1 * wall)  # drop the set-up and first kernels
    kept = [values for at, values in samples if at >= warm]
    result: dict[str, Any] = {
        "n_envs": n_envs,
        "hparams": hparams,
        "env_steps": log["env_steps"],
        "wall_s": wall,
        "steps_per_second": log["steps_per_second"],
        "precision": log["precision"]["mode"],
        "samples": len(kept),
    }
    key = "gpu_util" if device.type == "cuda" else "cpu_util"
    result[key] = summarize([values[key] for values in kept])
    if device.type == "cuda":
        result["mem_util"] = summarize([values["mem_util"] for values in kept])
        result["nvml_mem_used_max_bytes"] = max((values["mem_used"] for values in kept), default=None)
        result["torch_max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    return result


# The largest coming zoo model registers here as (name, algo module, spec) once it exists.
ZOO_TRAINING: list[tuple[str, str, dict[str, Any]]] = []


def section_utilization(device: torch.device, sizes: Sizes, data: Any, dry: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"ppo": sampled_training("ppo", data, sizes.ppo, device, sizes)}
    for name, algo, spec in ZOO_TRAINING:
        out[name] = sampled_training(algo, data, spec, device, sizes)
    out["zoo"] = [name for name, _, _ in ZOO_TRAINING] or "no zoo models registered yet"
    out["target"] = f"mean GPU utilization >= {UTILIZATION_TARGET:.0f}% over the run"
    if device.type == "cuda":
        means = [entry["gpu_util"]["mean"] for key, entry in out.items() if isinstance(entry, dict)]
        out["target_met"] = all(m is not None and m >= UTILIZATION_TARGET for m in means)
    else:
        out["status"] = f"{SKIPPED_NO_CUDA} (NVML); the sampler thread read this process's CPU share instead"
        out["target_met"] = None
    return out


# -------------------------------------------------------------------------------------------- 6. VRAM bounds


def dqn_step_at(batch: int, obs_dim: int, hidden: int, replay: int, plan: Any, device: torch.device) -> None:
    """Allocate what a one-seed DQN trainer holds (stacked networks, Adam, replay) and take one gradient step at
    ``batch``."""
    gpu_utils = STACK.load("gpu_utils")
    dqn, networks = STACK.load("marketrl.agents.dqn"), STACK.load("marketrl.agents.networks")
    architecture = networks.make_architecture("dqn", obs_dim, {"hidden_dim_base": hidden})
    q_net = dqn.StackedQNetwork([networks.build_networks(architecture)["q"]]).to(device)
    target = (
        dqn.StackedQNetwork([networks.build_networks(architecture)["q"]]).to(device).requires_grad_(False)
    )
    stepper = gpu_utils.SeedOptimStep.adam(q_net.parameters(), 1e-4, plan, 10.0, n_seeds=1)
    replay_buffer = dqn.ReplayBuffer(replay, obs_dim, device)
    for table in (replay_buffer.obs, replay_buffer.next_obs, replay_buffer.rewards):
        table.normal_()
    replay_buffer.actions.random_(0, 3)
    replay_buffer.discounts.fill_(0.99)
    replay_buffer.size = replay
    streams = gpu_utils.SeedStreams.from_generators([torch.Generator(device=device).manual_seed(0)], device)
    (transitions,) = replay_buffer.sample(batch, 1, streams)
    loss, _ = dqn.td_loss(q_net, target, transitions, plan, double_q=True)
    stepper.step(loss)
    synchronize(device)


def section_vram(device: torch.device, sizes: Sizes, data: Any, dry: bool) -> dict[str, Any]:
    gpu_utils = STACK.load("gpu_utils")
    plan = gpu_utils.detect_precision(device, "auto")
    obs_dim, hidden, replay = sizes.features + 1, sizes.vram_hidden, sizes.vram_replay
    if device.type == "cuda":
        torch.cuda.empty_cache()
    budget = gpu_utils.HardwareBudget.detect(device)
    memory = STACK.load("marketrl.agents.memory")
    footprint = memory.footprint("dqn", obs_dim, hidden, replay, plan)
    low, high = memory.batch_size_bounds(budget, "dqn", obs_dim, hidden, replay, plan)
    static = gpu_utils.static_memory_bytes(
        footprint["parameter_count"],
        frozen_parameter_count=footprint["frozen_parameter_count"],
        buffer_bytes=footprint["buffer_bytes"],
    )
    per_sample = footprint["bytes_per_sample"]
    memory_bound = (budget.usable_bytes - static) // per_sample  # before the spec's batch_limits clamp
    over = int(memory_bound * VRAM_OVERSHOOT)
    out: dict[str, Any] = {
        "budget": budget.to_dict(),
        "model": {"kind": "dqn", "obs_dim": obs_dim, "hidden_dim_base": hidden, "replay_capacity": replay},
        "precision": plan.mode,
        "bounds": [low, high],
        "static_bytes": static,
        "per_sample_bytes": per_sample,
        "memory_bound_batch": int(memory_bound),
        "overshoot_batch": over,
        "overshoot_predicted_to_fit": static + over * per_sample <= budget.usable_bytes,
    }
    if device.type != "cuda":
        # No allocator cap on the CPU: run the same step at the clamped bound only (tiny in --dry).
        dqn_step_at(min(high, 256), obs_dim, hidden, replay, plan, device)
        out["status"] = f"{SKIPPED_NO_CUDA} (memory cap and OOM check); one step at a small batch ran"
        out["target_met"] = None
        return out
    # the allocator cap needs an indexed device ("cuda" alone is refused)
    device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory
    # Cap this process at the budget's usable bytes plus what torch already holds, so "fits" means "fits in
    # the share the budget promised", not "fits in an otherwise empty 139 GiB".
    held = torch.cuda.memory_reserved(device)
    fraction = min(1.0, (budget.usable_bytes + held) / total)
    out["memory_cap_bytes"] = int(fraction * total)
    results: dict[str, Any] = {}
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    try:
        for label, batch in (("bound", int(memory_bound)), ("overshoot", over), ("clamped_max", high)):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            try:
                dqn_step_at(batch, obs_dim, hidden, replay, plan, device)
                results[label] = {
                    "batch": batch,
                    "fits": True,
                    "peak_bytes": torch.cuda.max_memory_allocated(device),
                }
            except torch.cuda.OutOfMemoryError as error:
                results[label] = {"batch": batch, "fits": False, "oom": str(error).splitlines()[0][:200]}
            torch.cuda.empty_cache()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    out["runs"] = results
    out["target"] = "the predicted bound fits under the cap; 1.5x of it is predicted not to fit"
    out["target_met"] = (
        bool(results["bound"]["fits"] and results["clamped_max"]["fits"])
        and not out["overshoot_predicted_to_fit"]
    )
    out["overshoot_really_failed"] = not results["overshoot"]["fits"]
    return out


# ------------------------------------------------------------------------------------- 7. seeds as one batch


def seeds_run(
    data: Any, spec: dict[str, Any], n_seeds: int, total_steps: int, device: torch.device, sizes: Sizes
) -> dict[str, Any]:
    """One PPO batch of ``n_seeds`` seeds (``train_seeds``) of ``total_steps`` env steps each; its logs."""
    ppo = STACK.load("marketrl.agents.ppo")
    config = ppo.PPOConfig(total_steps=total_steps, env=env_config(spec["n_envs"], sizes))
    started = time.perf_counter()
    results = ppo.train_seeds(data, config, spec["hparams"], "auto", device, list(range(n_seeds)))
    synchronize(device)
    wall = time.perf_counter() - started
    env_steps = sum(result.log["env_steps"] for result in results)
    return {
        "env_steps_all_seeds": env_steps,
        "wall_s": wall,
        "precision": results[0].log["precision"]["mode"],
    }


def section_seeds(device: torch.device, sizes: Sizes, data: Any, dry: bool) -> dict[str, Any]:
    gpu_utils, memory = STACK.load("gpu_utils"), STACK.load("marketrl.agents.memory")
    spec = sizes.seeds_spec
    hparams = spec["hparams"]
    rollout = spec["n_envs"] * hparams["n_steps"]
    plan = gpu_utils.detect_precision(device, "auto")
    budget = gpu_utils.HardwareBudget.detect(device)
    per_seed = memory.footprint("ppo", sizes.features + 1, hparams["hidden_dim_base"], rollout, plan)
    # a seed's share: its networks with Adam's moments, its rollout and one minibatch of activations
    seed_bytes = (
        gpu_utils.static_memory_bytes(per_seed["parameter_count"], buffer_bytes=per_seed["buffer_bytes"])
        + hparams["batch_size"] * per_seed["bytes_per_sample"]
    )
    max_seeds = max(1, int(budget.usable_bytes // seed_bytes))
    out: dict[str, Any] = {"spec": spec, "seed_bytes": seed_bytes, "max_seeds_by_vram": max_seeds, "runs": {}}
    base_rate = None
    for n_seeds in [s for s in sizes.seeds if s <= max_seeds]:
        warm = seeds_run(data, spec, n_seeds, 2 * rollout, device, sizes)  # kernels, allocator, rate
        rate = warm["env_steps_all_seeds"] / warm["wall_s"]
        steps = max(2 * rollout, int(rate * sizes.seeds_seconds / n_seeds) // rollout * rollout)
        if device.type == "cuda":
            read, close = nvml_reader(device)
        else:
            read, close = cpu_reader(), (lambda: None)
        sampler = Sampler(read, sizes.sample_interval)
        started = time.perf_counter()
        sampler.start()
        try:
            run = seeds_run(data, spec, n_seeds, steps, device, sizes)
        finally:
            samples = sampler.stop()
            close()
        warm_until = started + min(2.0, 0.1 * run["wall_s"])
        key = "gpu_util" if device.type == "cuda" else "cpu_util"
        run[key] = summarize([values[key] for at, values in samples if at >= warm_until])
        run["steps_per_second_all_seeds"] = run["env_steps_all_seeds"] / run["wall_s"]
        base_rate = base_rate or run["steps_per_second_all_seeds"]
        run["speedup_over_one_seed"] = run["steps_per_second_all_seeds"] / base_rate
        out["runs"][str(n_seeds)] = run
    out["target"] = f"mean GPU utilization >= {UTILIZATION_TARGET:.0f}% at the largest S"
    if device.type == "cuda" and out["runs"]:
        largest = out["runs"][max(out["runs"], key=int)]
        out["target_met"] = (largest["gpu_util"]["mean"] or 0.0) >= UTILIZATION_TARGET
    else:
        out["status"] = f"{SKIPPED_NO_CUDA} (NVML); the sampler read this process's CPU share instead"
        out["target_met"] = None
    return out


# ------------------------------------------------------------------------- 9. the captured update (issue 36)


def capture_pair(
    algo: str, data: Any, spec: dict[str, Any], steps: int, n_seeds: int, device: torch.device, sizes: Sizes
) -> dict[str, Any]:
    """The same S-seed run eager and captured: env steps/s of each (after a warm-up run of each), whether the
    capture happened, and the largest difference of any final weight of any seed between the two."""
    module = STACK.load(f"marketrl.agents.{algo}")
    config_cls = module.DQNConfig if algo == "dqn" else module.PPOConfig
    out: dict[str, Any] = {"spec": spec, "seeds": n_seeds, "env_steps_per_seed": steps}
    weights = {}
    for capture in (False, True):
        config = config_cls(total_steps=steps, env=env_config(spec["n_envs"], sizes), capture=capture)
        module.train_seeds(data, config, spec["hparams"], "auto", device, list(range(n_seeds)))  # warm-up
        synchronize(device)
        started = time.perf_counter()
        results = module.train_seeds(data, config, spec["hparams"], "auto", device, list(range(n_seeds)))
        synchronize(device)
        wall = time.perf_counter() - started
        key = "captured" if capture else "eager"
        out[key] = {
            "steps_per_second_all_seeds": n_seeds * results[0].log["env_steps"] / wall,
            "captured": results[0].log["captured"],
            "precision": results[0].log["precision"]["mode"],
        }
        weights[key] = [
            tensor.float()
            for result in results
            for net in result.networks.values()
            for tensor in net.state_dict().values()
        ]
    out["max_weight_difference"] = max(
        (a - b).abs().max().item() for a, b in zip(weights["eager"], weights["captured"], strict=True)
    )
    out["captured_over_eager"] = (
        out["captured"]["steps_per_second_all_seeds"] / out["eager"]["steps_per_second_all_seeds"]
    )
    return out


def section_capture(device: torch.device, sizes: Sizes, data: Any, dry: bool) -> dict[str, Any]:
    """PPO (the seeds section's demo-sized spec) and DQN (its hidden 64, batch 256, 64 envs a seed) with S seeds,
    eager against captured (one CUDA graph an epoch / a gradient step): the same weights, and the speed-up. On the
    CPU both runs are eager (the check that the flag changes nothing there)."""
    n_seeds = sizes.capture_seeds
    ppo_spec = sizes.seeds_spec
    ppo_steps = 4 * ppo_spec["n_envs"] * ppo_spec["hparams"]["n_steps"]
    dqn_spec = {"n_envs": ppo_spec["n_envs"], "hparams": {**sizes.capture_dqn_hparams}}
    dqn_steps = dqn_spec["hparams"]["learning_starts"] + 200 * dqn_spec["n_envs"]
    out = {
        "ppo": capture_pair("ppo", data, ppo_spec, ppo_steps, n_seeds, device, sizes),
        "dqn": capture_pair("dqn", data, dqn_spec, dqn_steps, n_seeds, device, sizes),
    }
    out["target"] = "captured on CUDA, weights within 1e-3 of eager, captured faster"
    if device.type == "cuda":
        out["target_met"] = all(
            run["captured"]["captured"]
            and run["max_weight_difference"] <= 1e-3
            and run["captured_over_eager"] > 1
            for run in (out["ppo"], out["dqn"])
        )
    else:
        out["status"] = f"{SKIPPED_NO_CUDA} (both runs eager)"
        out["target_met"] = None
    return out


# ----------------------------------------------------------------------- 10. folds on the batch axis (issue 36)


def folds_run(
    algo: str,
    data: Any,
    spec: dict[str, Any],
    n_seeds: int,
    steps: int,
    device: torch.device,
    sizes: Sizes,
    block_rows: list[tuple[int, int]] | None = None,
    sample: bool = False,
) -> dict[str, Any]:
    """One ``train_seeds`` batch of ``n_seeds`` copies (``block_rows``: each on its own fold's rows of a stacked
    table), optionally sampling utilization; its all-copies rate."""
    module = STACK.load(f"marketrl.agents.{algo}")
    config_cls = module.DQNConfig if algo == "dqn" else module.PPOConfig
    config = config_cls(total_steps=steps, env=env_config(spec["n_envs"], sizes))
    close: Callable[[], None] = lambda: None  # noqa: E731
    sampler = None
    if sample:  # the sampler (and NVML) only for the timed run
        read, close = nvml_reader(device) if device.type == "cuda" else (cpu_reader(), close)
        sampler = Sampler(read, sizes.sample_interval)
    started = time.perf_counter()
    if sampler is not None:
        sampler.start()
    try:
        results = module.train_seeds(
            data, config, spec["hparams"], "auto", device, list(range(n_seeds)), block_rows=block_rows
        )
        synchronize(device)
    finally:
        samples = sampler.stop() if sampler is not None else []
        close()
    wall = time.perf_counter() - started
    out: dict[str, Any] = {
        "copies": n_seeds,
        "wall_s": wall,
        "steps_per_second_all_copies": n_seeds * results[0].log["env_steps"] / wall,
        "precision": results[0].log["precision"]["mode"],
        "captured": results[0].log.get("captured"),
    }
    if sample:
        key = "gpu_util" if device.type == "cuda" else "cpu_util"
        warm_until = started + min(2.0, 0.1 * wall)
        out[key] = summarize([values[key] for at, values in samples if at >= warm_until])
    return out


def section_folds(device: torch.device, sizes: Sizes, data: Any, dry: bool) -> dict[str, Any]:
    """The demo's PPO and DQN (the capture section's specs) with S seeds on each of F folds' own data, the F × S
    copies as one batch (training.batch_folds: stacked windows, each env block on its own fold's rows; F as the
    memory budget allows, `folds_per_batch`), against one fold of S seeds alone: the all-copies rate of each and
    the batch's mean utilization (target >= 80%)."""
    env, gpu_utils = STACK.load("marketrl.env"), STACK.load("gpu_utils")
    memory = STACK.load("marketrl.agents.memory")
    n_seeds = sizes.capture_seeds
    ppo_spec = sizes.seeds_spec
    dqn_spec = {"n_envs": ppo_spec["n_envs"], "hparams": {**sizes.capture_dqn_hparams}}
    per_fold = max(4 * sizes.episode_length, data.n_rows // sizes.folds)
    parts = [
        synthetic_market_data(per_fold, sizes.features, device, seed=fold) for fold in range(sizes.folds)
    ]
    plan = gpu_utils.detect_precision(device, "auto")
    budget = gpu_utils.HardwareBudget.detect(device)
    out: dict[str, Any] = {"seeds_per_fold": n_seeds, "rows_per_fold": per_fold}
    for algo, spec in (("ppo", ppo_spec), ("dqn", dqn_spec)):
        n_envs = spec["n_envs"]
        fits = memory.folds_per_batch(
            budget, algo, sizes.features + 1, spec["hparams"], n_envs, plan, n_seeds, sizes.folds
        )
        stacked, ranges = env.stack_market_data(parts[:fits])
        rows = [ranges[fold] for fold in range(fits) for _ in range(n_seeds)]
        unit = n_envs * ppo_spec["hparams"]["n_steps"] if algo == "ppo" else n_envs
        warm_steps = max(2 * unit, spec["hparams"].get("learning_starts", 0) + 20 * n_envs)
        # warm-ups (kernels, allocator, the capture) and the rates that size the timed runs
        one = folds_run(algo, parts[0], spec, n_seeds, warm_steps, device, sizes)
        batch = folds_run(algo, stacked, spec, fits * n_seeds, warm_steps, device, sizes, rows)
        rate = batch["steps_per_second_all_copies"] / (fits * n_seeds)
        steps = max(warm_steps, int(rate * sizes.folds_seconds) // unit * unit)
        one = folds_run(algo, parts[0], spec, n_seeds, steps, device, sizes)
        batch = folds_run(algo, stacked, spec, fits * n_seeds, steps, device, sizes, rows, sample=True)
        out[algo] = {
            "spec": spec,
            "folds_by_memory": fits,
            "env_steps_per_copy": steps,
            "one_fold": one,
            "folds_batched": batch,
            "batched_over_one_fold": batch["steps_per_second_all_copies"]
            / one["steps_per_second_all_copies"],
        }
    out["target"] = f"mean GPU utilization >= {UTILIZATION_TARGET:.0f}% with F x S copies"
    if device.type == "cuda":
        out["target_met"] = all(
            (out[algo]["folds_batched"]["gpu_util"]["mean"] or 0.0) >= UTILIZATION_TARGET
            for algo in ("ppo", "dqn")
        )
    else:
        out["status"] = f"{SKIPPED_NO_CUDA} (NVML); the sampler read this process's CPU share instead"
        out["target_met"] = None
    return out


# ------------------------------------------------------------------------------ 8. where GAE is cheapest


def section_gae(device: torch.device, sizes: Sizes, dry: bool) -> dict[str, Any]:
    """PPO's GAE and rollout statistics on the host (one copy + numpy) against on the device (torch scan), the
    trainer's own two functions on a synthetic rollout of 64 steps × C columns (4 seeds), each the median of
    ``gae_repeats`` synchronized calls; the crossover is the smallest C from which the device side is faster."""
    ppo, advantages = STACK.load("marketrl.agents.ppo"), STACK.load("gpu_utils.advantages")
    hp, steps, n_seeds = ppo.PPOHyperparams(), 64, 4
    rows = []
    for columns in sizes.gae_columns:
        generator = torch.Generator().manual_seed(columns)
        ended = torch.rand(steps, columns, generator=generator) < 1 / 64
        truncated = ended & (torch.rand(steps, columns, generator=generator) < 0.2)
        tables = [torch.randn(steps, columns, generator=generator) for _ in range(3)]
        rollout = ppo.GaeInputs(*(t.to(device) for t in (*tables, ended & ~truncated, truncated)))
        running = np.zeros(columns)
        times: dict[str, list[float]] = {"host": [], "device": []}
        for repeat in range(sizes.gae_repeats + 1):  # the first call of each side warms up
            for side, function in (("host", ppo.gae_on_host), ("device", ppo.gae_on_device)):
                synchronize(device)
                started = time.perf_counter()
                function(rollout, running, hp, n_seeds)
                synchronize(device)
                if repeat:
                    times[side].append(time.perf_counter() - started)
        host_ms, device_ms = (1e3 * statistics.median(times[side]) for side in ("host", "device"))
        rows.append({"columns": columns, "host_ms": host_ms, "device_ms": device_ms})
    faster = [row["columns"] for row in rows if row["device_ms"] < row["host_ms"]]
    return {
        "rows": rows,
        "crossover_columns": min(faster) if faster else None,
        "rule_columns": advantages.GAE_DEVICE_MIN_COLUMNS,
        "target_met": None,
    }


# ------------------------------------------------------------------------------------------------------ main


SECTIONS: list[tuple[str, Callable[..., dict[str, Any]], bool]] = [
    # (name, function, needs the synthetic MarketData)
    ("precision", section_precision, False),
    ("host_syncs", section_host_syncs, True),
    ("env", section_env, True),
    ("bf16_vs_fp32", section_bf16_vs_fp32, True),
    ("utilization", section_utilization, True),
    ("vram", section_vram, True),
    ("seeds", section_seeds, True),
    ("gae", section_gae, False),
    ("capture", section_capture, True),
    ("folds", section_folds, True),
]


def run_section(name: str, function: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one section; an exception becomes ``status: error`` with its one-line reason and traceback tail."""
    started = time.perf_counter()
    try:
        result = function()
        result.setdefault("status", "ok")
    except Exception as error:
        result = {
            "status": f"error: {type(error).__name__}: {error}",
            "traceback": traceback.format_exc().splitlines()[-6:],
        }
    result["seconds"] = round(time.perf_counter() - started, 3)
    print(f"[gpu_check] {name}: {result['status']} ({result['seconds']:.1f} s)", flush=True)
    return result


def table(report: dict[str, Any]) -> str:
    """The short Markdown summary of the JSON."""
    lines = ["| section | result | target met |", "|---|---|---|"]
    sections = report["sections"]

    def row(name: str, text: str) -> None:
        met = sections[name].get("target_met")
        lines.append(f"| {name} | {text} | {'—' if met is None else ('yes' if met else 'NO')} |")

    for name in sections:
        section = sections[name]
        if not str(section.get("status", "")).startswith(("ok", "skipped")):
            lines.append(f"| {name} | {section['status'][:160]} | NO |")
            continue
        if name == "precision":
            plan = section["plan"]
            dtypes = section["trainers"]["auto"]["dqn"]["linear_output_dtypes"]
            row(name, f"{plan['device_name']} cap {plan['capability']}: {plan['mode']}; Linear out {dtypes}")
        elif name == "host_syncs":
            parts = [
                f"{key}: +{value['cuda_syncs_added_by_doubling']} CUDA / +{value['sync_counter_added_by_doubling']}"
                " counted"
                for key, value in section.items()
                if isinstance(value, dict)
            ]
            row(name, "; ".join(parts))
        elif name == "env":
            row(
                name,
                ", ".join(f"N={r['n_envs']:,}: {r['steps_per_second']:,.0f}/s" for r in section["results"]),
            )
        elif name == "bf16_vs_fp32":
            row(
                name,
                "; ".join(
                    f"{algo}: fp32 {section[algo]['fp32']['steps_per_second']:,.0f}/s, bf16 "
                    f"{section[algo]['bf16']['steps_per_second']:,.0f}/s ({section[algo]['bf16_over_fp32']:.2f}×)"
                    for algo in ("dqn", "ppo")
                ),
            )
        elif name == "utilization":
            ppo = section["ppo"]
            key = "gpu_util" if "gpu_util" in ppo else "cpu_util"
            mean = ppo[key]["mean"]
            row(name, f"PPO {ppo['wall_s']:.0f} s: mean {key} {mean if mean is None else round(mean, 1)}%")
        elif name == "vram":
            runs = section.get("runs", {})
            text = f"bound {section['memory_bound_batch']:,} (clamped max {section['bounds'][1]:,})"
            if runs:
                text += "; " + ", ".join(
                    f"{k} {v['batch']:,}: {'fits' if v['fits'] else 'OOM'}" for k, v in runs.items()
                )
            row(name, text)
        elif name == "seeds":
            parts = []
            for n_seeds, run in section["runs"].items():
                key = "gpu_util" if "gpu_util" in run else "cpu_util"
                mean = run[key]["mean"]
                parts.append(
                    f"S={n_seeds}: {run['steps_per_second_all_seeds']:,.0f}/s "
                    f"({run['speedup_over_one_seed']:.1f}x), {key} {mean if mean is None else round(mean, 1)}%"
                )
            row(name, "; ".join(parts))
        elif name == "capture":
            parts = [
                f"{algo}: eager {section[algo]['eager']['steps_per_second_all_seeds']:,.0f}/s, captured "
                f"{section[algo]['captured']['steps_per_second_all_seeds']:,.0f}/s "
                f"({section[algo]['captured_over_eager']:.2f}x, graph: {section[algo]['captured']['captured']}), "
                f"max weight diff {section[algo]['max_weight_difference']:.1e}"
                for algo in ("ppo", "dqn")
            ]
            row(name, "; ".join(parts))
        elif name == "folds":
            parts = []
            for algo in ("ppo", "dqn"):
                run = section[algo]
                batch = run["folds_batched"]
                key = "gpu_util" if "gpu_util" in batch else "cpu_util"
                mean = batch[key]["mean"]
                parts.append(
                    f"{algo}: {run['folds_by_memory']} folds x {section['seeds_per_fold']} seeds "
                    f"{batch['steps_per_second_all_copies']:,.0f}/s ({run['batched_over_one_fold']:.1f}x one fold), "
                    f"{key} {mean if mean is None else round(mean, 1)}%"
                )
            row(name, "; ".join(parts))
        elif name == "gae":
            parts = [
                f"C={r['columns']:,}: host {r['host_ms']:.2f} ms, device {r['device_ms']:.2f} ms"
                for r in section["rows"]
            ]
            parts.append(
                f"device faster from C={section['crossover_columns']} (rule: {section['rule_columns']:,})"
            )
            row(name, "; ".join(parts))
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_dir: Path) -> str:
    """Write gpu_check.json and gpu_check.md (each through a rename, never half-written); return the table."""
    summary = table(report)
    for name, text in (
        ("gpu_check.json", json.dumps(report, indent=2, default=str)),
        ("gpu_check.md", summary),
    ):
        tmp = out_dir / f".{name}.tmp"
        tmp.write_text(text + "\n")
        tmp.replace(out_dir / name)
    return summary


def default_out() -> Path:
    return Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO_ROOT / "results"


def main(argv: list[str] | None = None) -> int:
    """Run every section, write gpu_check.json and gpu_check.md; exit 1 if a section errored."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: $OUT, else results/)")
    parser.add_argument(
        "--dry",
        "--quick",
        dest="dry",
        action="store_true",
        help="tiny sizes on the CPU, seconds (--quick: the same)",
    )
    parser.add_argument("--device", default=None, help="default: cuda if available (cpu with --dry)")
    names = [name for name, _, _ in SECTIONS]
    parser.add_argument("--only", nargs="+", choices=names, help="run only these sections (a rerun)")
    parser.add_argument(
        "--train-seconds", type=float, default=None, help="section 5's run (default 60, dry 1)"
    )
    args = parser.parse_args(argv)
    out_dir = args.out or default_out()
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device or ("cpu" if args.dry or not torch.cuda.is_available() else "cuda"))
    sizes = DRY if args.dry else FULL
    if args.train_seconds is not None:
        sizes = dataclasses.replace(sizes, train_seconds=args.train_seconds)
    torch.manual_seed(0)
    if args.dry:  # a shared CI machine: extra intra-op threads only contend with the sampler and other jobs
        torch.set_num_threads(1)
    started = time.perf_counter()
    report: dict[str, Any] = {
        "dry": args.dry,
        "device": str(device),
        "cuda_available": torch.cuda.is_available(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "sizes": dataclasses.asdict(sizes),
        "sections": {},
    }
    data_holder: dict[str, Any] = {}

    def data() -> Any:
        if "data" not in data_holder:
            data_holder["data"] = synthetic_market_data(sizes.rows, sizes.features, device)
        return data_holder["data"]

    summary = ""
    for name, function, needs_data in SECTIONS:
        if args.only and name not in args.only:
            continue
        call = (
            (lambda f=function: f(device, sizes, data(), args.dry))
            if needs_data
            else (lambda f=function: f(device, sizes, args.dry))
        )
        report["sections"][name] = run_section(name, call)
        report["total_seconds"] = round(time.perf_counter() - started, 1)
        summary = write_report(
            report, out_dir
        )  # after every section: a timeout still leaves the finished ones
    print(summary)
    print(f"[gpu_check] wrote {out_dir / 'gpu_check.json'} in {report['total_seconds']} s")
    errors = [n for n, s in report["sections"].items() if str(s["status"]).startswith("error")]
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
