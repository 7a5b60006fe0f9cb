"""Benchmark: the model zoo's training throughput through each model's real train call, next to its floor.

    python bench/speed/models.py                     # every model, CPU, torch at 1 thread
    python bench/speed/models.py --quick             # a short sanity run of every model (what the test runs)
    python bench/speed/models.py --only lstm lightgbm --json results.json
    python bench/speed/models.py --device cuda       # torch models and ridge on the GPU (LightGBM stays on the CPU)

Data: `--days` demo days (marketrl.data.demo, docs/DEMO_DATA.md) featurized with `build_feature_file` as the
pipeline does (51 float32 features), normalized with the normalizer fit on those rows, as one training split
(`build_window`, config defaults). Every model trains with its dataclass defaults (override with
`--batch-size`, `--hidden`), seed `--seed`, no validation split (no validation pass, no early stopping).

For each model, in one process, interleaved round by round (the order alternating between rounds) so that
load spikes hit both sides:

* **model**: `MODELS[name].train_seeds(..., [seed])`, the real call the pipeline makes, timed whole (rows, the budget probe,
  the loop, the final statistics read). Torch models run exactly `--steps` optimizer steps (`max_steps`);
  LightGBM `--rounds` boosting rounds; ridge one closed-form fit. For torch models, "loop" is the trainer's own
  `steps_per_second` (from the start of the step loop to the drained device: no row building, no probe).
* **floor**: the unavoidable math of the same work. Torch: the same module (same builder, hyperparameters and
  seed, so the same initial weights), the same batch size the trainer chose, precision plan, optimizer
  (`make_optimizer`, `OptimStep`, grad clip) and loss, for the same number of steps, on random tensors already
  on the device (a few distinct batches cycled); no row gather, no shuffle, no statistics, no validation.
  LightGBM: `lightgbm.train` on the same matrix (the flattened windows, built before the clock starts) with
  the same parameters (`lightgbm_model._params`), no validation sets and no callback. Ridge: the same normal
  equations in float64 (Gram matrix centred algebraically, one solve) on the same flattened matrix built
  before the clock starts, in one piece rather than gathered in chunks.

Reported: samples/s of each (torch: steps × batch; LightGBM: rounds × training rows; ridge: training rows per
fit), the ratio model / floor (1.0 = no overhead; the median of the per-round ratios), and host syncs counted
by `gpu_utils.SyncCounter` in one extra, untimed run of each side (it doubles as the warm-up) for the torch
models (the host-sync budget is theirs; LightGBM is a host library, ridge one fit). Sanity checks,
raised as errors: the floor module has the trainer's parameter count; the LightGBM floor's booster predicts
what the trained model predicts; the ridge floor's weights equal the fitted model's.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gpu_utils import OptimStep, PrecisionPlan, SyncCounter, make_optimizer, resolve_precision
from marketrl.env import MarketData
from marketrl.loop.hparams import parse_hparams
from marketrl.models import MODELS, RunSettings, lightgbm_model
from marketrl.models.supervised_data import gather_windows, training_rows
from marketrl.models.supervised_trainer import TargetScaled

#: The builder each torch model's registry entry was made with (`torch_model_spec(name, ..., build)`: its spec's
#: `build_module`).
TORCH_BUILDERS: dict[str, Callable[[Any, int], nn.Module]] = {
    name: spec.build_module for name, spec in MODELS.items() if spec.build_module is not None
}
#: Distinct random batches the torch floor cycles through (the data streams through memory as in training).
FLOOR_BATCHES = 8
RIDGE_JITTER = 1e-9  # linear.fit_ridge's floor on the penalty, so the two solve the same system
clock = time.perf_counter  # --clock cpu switches to process CPU time (steadier on a shared machine)


@dataclass
class Result:
    """One model's figures (seconds per round, side by side) and what was run."""

    model: str
    steps: int
    batch: int  # torch: the trainer's batch size; LightGBM and ridge: all training rows
    samples: int  # per run
    train_rows: int
    parameters: int | None
    hparams: dict[str, Any]
    model_s: list[float] = field(default_factory=list)
    loop_s: list[float] = field(default_factory=list)  # torch only: from the trainer's steps_per_second
    floor_s: list[float] = field(default_factory=list)
    model_syncs: int | None = None
    floor_syncs: int | None = None

    def summary(self) -> dict[str, Any]:
        """Medians, samples/s and the ratios (median of per-round ratios)."""
        out: dict[str, Any] = asdict(self)
        for side in ("model", "loop", "floor"):
            times = getattr(self, f"{side}_s")
            out[f"{side}_samples_per_s"] = self.samples / statistics.median(times) if times else None
        ratios = [f / m for f, m in zip(self.floor_s, self.model_s, strict=True)]
        out["model_over_floor"] = statistics.median(ratios)
        out["model_over_floor_range"] = [min(ratios), max(ratios)]
        out["loop_over_floor"] = _median_ratio(self.floor_s, self.loop_s) if self.loop_s else None
        # What the model's call adds per step (torch: optimizer step; LightGBM: round; ridge: the one fit).
        extra = statistics.median(self.model_s) - statistics.median(self.floor_s)
        out["overhead_ms_per_step"] = 1e3 * extra / self.steps
        return out


def _median_ratio(floor: list[float], side: list[float]) -> float:
    return statistics.median(f / s for f, s in zip(floor, side, strict=True))


# ------------------------------------------------------------------------------------------------------- data


def demo_training_split(days: int, seed: int, device: torch.device) -> MarketData:
    """`days` demo days -> feature files -> one normalized training split on `device`, as the pipeline builds it."""
    from marketrl.data.definitions import demo_run_config
    from marketrl.data.demo import generate_demo_files
    from marketrl.features import build_feature_file
    from marketrl.splits.datasets import build_window, load_feature_tables

    with tempfile.TemporaryDirectory(prefix="bench-models-") as tmp:
        raw = generate_demo_files(Path(tmp) / "raw", "2024-01-02", days, seed=seed)
        tables = []
        for i, path in enumerate(raw):
            out = Path(tmp) / "features" / path.name.replace(".dbn.zst", ".parquet")
            build_feature_file(path, out, prev_src=raw[i - 1] if i else None)
            tables.append(out)
        table = load_feature_tables(tables)
        config = demo_run_config(Path(tmp) / "raw")  # NQ costed with its own contract spec
    return build_window(table, {"train": table}, config, device).splits["train"]


# ------------------------------------------------------------------------------------------------ the two sides


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (CUDA) before reading the clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, run: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds of ``run()`` on the chosen clock, the device drained before and after, and its result."""
    synchronize(device)
    started = clock()
    result = run()
    synchronize(device)
    return clock() - started, result


def rounds(
    repeats: int, device: torch.device, model: Callable[[], Any], floor: Callable[[], Any]
) -> list[tuple[float, Any, float]]:
    """(model seconds, model result, floor seconds) per round; the order alternates between rounds, so a slow
    patch of the shared machine or a warming cache does not always hit the same side."""
    out = []
    for round_index in range(repeats):
        if round_index % 2:
            floor_seconds = timed(device, floor)[0]
            seconds, result = timed(device, model)
        else:
            seconds, result = timed(device, model)
            floor_seconds = timed(device, floor)[0]
        out.append((seconds, result, floor_seconds))
    return out


def counted(device: torch.device, run: Callable[[], Any]) -> tuple[int, Any]:
    """Host syncs of ``run()``; on a CPU run, calls on CPU tensors count (they stand in for the device reads)."""
    with SyncCounter(count_cpu=device.type == "cpu") as counter:
        result = run()
    return counter.count, result


@dataclass
class TorchFloor:
    """The same module, optimizer step and loss on random batches already on the device."""

    module: nn.Module
    stepper: OptimStep
    batches: list[tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def build(
        cls,
        name: str,
        hp: Any,
        n_features: int,
        batch: int,
        plan: PrecisionPlan,
        device: torch.device,
        seed: int,
    ) -> TorchFloor:
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            torch.manual_seed(seed)  # the trainer initializes under the same seed: the same initial weights
            module = TargetScaled(TORCH_BUILDERS[name](hp, n_features)).to(device)
        module.train()
        optimizer = make_optimizer(
            module.parameters(), hp.learning_rate, plan, device, weight_decay=hp.weight_decay
        )
        generator = torch.Generator(device=device).manual_seed(seed)
        windows = torch.randn(FLOOR_BATCHES, batch, hp.window, n_features, generator=generator, device=device)
        target = torch.randn(FLOOR_BATCHES, batch, generator=generator, device=device)
        batches = list(zip(windows.unbind(0), target.unbind(0), strict=True))
        return cls(module, OptimStep(optimizer, plan, hp.max_grad_norm), batches)

    def run(self, steps: int) -> None:
        """``steps`` optimizer steps, the trainer's forward, loss and step, nothing else."""
        for step in range(steps):
            windows, target = self.batches[step % len(self.batches)]
            with self.stepper.autocast():
                prediction = self.module(windows).float().reshape(-1)
            loss = (prediction - target / self.module.scale).square().mean()
            self.stepper.step(loss)


def bench_torch(
    name: str, data: MarketData, args: argparse.Namespace, plan: PrecisionPlan, device: torch.device
) -> Result:
    spec = MODELS[name]
    hparams = _overrides(args)
    settings = RunSettings(epochs=args.steps, max_steps=args.steps, check_every=args.check_every)

    def train() -> dict[str, Any]:
        return spec.train_seeds(data, None, settings, hparams, plan, device, [args.seed])[0].log

    model_syncs, log = counted(device, train)
    if log["steps"] != args.steps:
        raise RuntimeError(f"{name}: trained {log['steps']} steps, expected {args.steps}")
    hp = parse_hparams(spec.hparams_class, hparams, name)
    batch = log["batch_size"]
    floor = TorchFloor.build(name, hp, data.n_features, batch, plan, device, args.seed)
    parameters = sum(p.numel() for p in floor.module.parameters())
    if parameters != log["parameter_count"]:
        raise RuntimeError(
            f"{name}: floor module has {parameters} parameters, the trainer's {log['parameter_count']}"
        )
    floor_syncs, _ = counted(device, lambda: floor.run(args.steps))
    result = Result(
        name,
        args.steps,
        batch,
        args.steps * batch,
        log["train_rows"],
        parameters,
        {**asdict(hp)},
        model_syncs=model_syncs,
        floor_syncs=floor_syncs,
    )
    for seconds, log, floor_seconds in rounds(args.repeats, device, train, lambda: floor.run(args.steps)):
        result.model_s.append(seconds)
        result.floor_s.append(floor_seconds)
        if clock is time.perf_counter:  # the trainer's own rate is wall-clock
            result.loop_s.append(log["steps"] / log["steps_per_second"])
    return result


def bench_lightgbm(data: MarketData, args: argparse.Namespace) -> Result:
    import lightgbm

    spec = MODELS["lightgbm"]
    hparams = {"n_estimators": args.rounds}
    settings = RunSettings(epochs=1, check_every=args.check_every)
    hp = parse_hparams(spec.hparams_class, hparams, "lightgbm")
    rows = training_rows(data.to("cpu"), hp.window, settings.horizon)
    x, y = lightgbm_model._matrix(rows)
    params = lightgbm_model._params(hp, args.seed, args.seed)
    cpu = torch.device("cpu")

    def train() -> Any:
        return spec.train_seeds(data, None, settings, hparams, "fp32", "cpu", [args.seed])[0]

    def floor() -> Any:
        return lightgbm.train(params, lightgbm.Dataset(x, y), num_boost_round=args.rounds)

    model = train()  # also the warm-up
    booster = floor()
    ours = model.predict(data.to("cpu")).index_select(0, rows.rows.cpu()).numpy()
    if not np.allclose(ours, booster.predict(x), rtol=1e-5, atol=1e-9):
        raise RuntimeError("lightgbm: the floor's booster predicts differently from the trained model")
    result = Result(
        "lightgbm", args.rounds, rows.n_rows, args.rounds * rows.n_rows, rows.n_rows, None, asdict(hp)
    )
    for seconds, _, floor_seconds in rounds(args.repeats, cpu, train, floor):
        result.model_s.append(seconds)
        result.floor_s.append(floor_seconds)
    return result


def ridge_floor(flat: torch.Tensor, target: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge normal equations in float64 on the whole flattened matrix at once: one Gram matrix, centred
    algebraically (no centred copy of the matrix), one solve."""
    x, y = flat.double(), target.double()
    n, width = x.shape
    mean_x, mean_y = x.mean(dim=0), y.mean()
    scatter = x.T @ x - n * torch.outer(mean_x, mean_x)
    cross = x.T @ y - n * mean_x * mean_y
    eye = torch.eye(width, dtype=torch.float64, device=x.device)
    weights = torch.linalg.solve(scatter + (alpha + RIDGE_JITTER) * n * eye, cross)
    return weights, mean_y - mean_x @ weights


def bench_ridge(data: MarketData, args: argparse.Namespace, device: torch.device) -> Result:
    spec = MODELS["linear"]
    settings = RunSettings(epochs=1, check_every=args.check_every)
    hp = parse_hparams(spec.hparams_class, {}, "linear")
    rows = training_rows(data, hp.window, settings.horizon)
    flat = gather_windows(rows.features, rows.rows, hp.window).reshape(rows.n_rows, -1)
    target = rows.target.index_select(0, rows.rows)

    def train() -> Any:
        return spec.train_seeds(data, None, settings, {}, "fp32", device, [args.seed])[0]

    model = train()  # also the warm-up
    weights, _ = ridge_floor(flat, target, hp.alpha)
    if not torch.allclose(weights.cpu(), model.state["weights"], rtol=1e-6, atol=1e-12):
        raise RuntimeError("linear: the floor's weights differ from the fitted model's")
    result = Result("linear", 1, rows.n_rows, rows.n_rows, rows.n_rows, int(weights.numel()) + 1, asdict(hp))
    for seconds, _, floor_seconds in rounds(
        args.repeats, device, train, lambda: ridge_floor(flat, target, hp.alpha)
    ):
        result.model_s.append(seconds)
        result.floor_s.append(floor_seconds)
    return result


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.batch_size is not None:
        out["batch_size"] = args.batch_size
    if args.hidden is not None:
        out["hidden_dim_base"] = args.hidden
    return out


# ------------------------------------------------------------------------------------------------------- main


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table of the run."""

    def rate(value: float | None) -> str:
        return "–" if value is None else f"{value:,.0f}"

    def ratio(value: float | None) -> str:
        return "–" if value is None else f"{value:.2f}"

    def syncs(value: int | None) -> str:
        return "–" if value is None else str(value)

    lines = [
        "| model | steps | batch | params | model samples/s | loop samples/s | floor samples/s "
        "| model / floor (range) | loop / floor | overhead ms/step | syncs model / floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        low, high = r["model_over_floor_range"]
        lines.append(
            f"| {r['model']} | {r['steps']:,} | {r['batch']:,} | {syncs(r['parameters'])} | "
            f"{rate(r['model_samples_per_s'])} | {rate(r['loop_samples_per_s'])} | "
            f"{rate(r['floor_samples_per_s'])} | {ratio(r['model_over_floor'])} ({low:.2f}–{high:.2f}) | "
            f"{ratio(r['loop_over_floor'])} | {r['overhead_ms_per_step']:+.2f} | "
            f"{syncs(r['model_syncs'])} / {syncs(r['floor_syncs'])} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes: 2 days, 10 steps, 10 rounds, 1 repeat"
    )
    parser.add_argument("--only", nargs="+", choices=list(MODELS), help="run only these models")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument("--days", type=int, default=None, help="demo days of training rows (default 20)")
    parser.add_argument(
        "--steps", type=int, default=None, help="optimizer steps per torch model (default 200)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="LightGBM boosting rounds (default 100)")
    parser.add_argument("--check-every", type=int, default=None, help="steps between reads (default 50)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per model (default 3)")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="override every torch model's batch_size"
    )
    parser.add_argument(
        "--hidden", type=int, default=None, help="override every torch model's hidden_dim_base"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch (and LightGBM) threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: process CPU time, steadier on a busy machine (CPU device only; no loop column)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    args = parser.parse_args(argv)
    quick = {"days": 2, "steps": 10, "rounds": 10, "check_every": 5, "repeats": 1}
    full = {"days": 20, "steps": 200, "rounds": 100, "check_every": 50, "repeats": 3}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("days", "steps", "rounds", "check_every", "repeats", "threads"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')}: expected an integer >= 1, got {getattr(args, key)}")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the chosen models and print the table (and write the JSON)."""
    args = parse_args(argv)
    global clock
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.clock == "cpu" and torch.device(args.device).type != "cpu":
        raise SystemExit(
            "--clock cpu: process CPU time does not time device work; use --clock wall with --device"
        )
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    plan = resolve_precision(args.precision, device)
    data = demo_training_split(args.days, args.seed, device)
    names = [name for name in MODELS if not args.only or name in args.only]
    header = (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()} {platform.node()}, torch {torch.__version__}, "
        f"{args.threads} thread(s), device {device}, precision {plan.mode}; {data.n_rows:,} training bars × "
        f"{data.n_features} features ({args.days} demo days), seed {args.seed}, median of {args.repeats}, "
        f"{args.clock} clock; "
        f"torch: {args.steps} steps, check_every {args.check_every}; LightGBM: {args.rounds} rounds"
    )
    print(header, flush=True)
    results = []
    for name in names:
        if name == "lightgbm":
            result = bench_lightgbm(data, args)
        elif name == "linear":
            result = bench_ridge(data, args, device)
        else:
            result = bench_torch(name, data, args, plan, device)
        summary = result.summary()
        results.append(summary)
        print(
            f"  {name}: model {summary['model_samples_per_s']:,.0f} samples/s, floor "
            f"{summary['floor_samples_per_s']:,.0f}, ratio {summary['model_over_floor']:.2f}",
            flush=True,
        )
    print(table(results))
    if args.json is not None:
        report = {
            "header": header,
            "args": {
                key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()
            },
            "device": str(device),
            "precision": plan.mode,
            "train_bars": data.n_rows,
            "features": data.n_features,
            "results": results,
        }
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
