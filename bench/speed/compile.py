"""Benchmark (issue 36, item 2 on the CPU): the trainers' captured calls (a PPO epoch, a DQN gradient step) run
eagerly, as the product does on the CPU, against the same calls through `torch.compile` (inductor), side by side
in one process, torch at 1 thread, S = 5 seeds.

    python bench/speed/compile.py              # PPO and DQN at the demo's sizes, two run lengths each
    python bench/speed/compile.py --quick      # tiny sizes: a check (tests/test_bench_quick.py)

Each `gpu_utils.CapturedCall` the trainer builds is given ``torch.compile(fn)`` instead of ``fn`` (the bench wraps
the class; the product never compiles). Per algorithm: eager and compiled runs of a short and a long length; the
first compiled run pays the cold compile (the script gives inductor an empty cache directory of its own), a repeat
of it the warm one (inductor's on-disk cache filled: what a later job on the same machine pays). Reported: the
compile cost (compiled short run − eager short run, cold and warm), the speed-up per env step once compiled (the
difference long − short of each side), and the env steps a seed after which compiling pays (cost / saving per
step). Equal work is checked: both sides make the same env steps, and after the short run end within
``--tolerance`` of the same weights (fusion reorders float sums; over longer runs the difference grows, as with
any reordering).
Where torch cannot compile here (no C++ compiler), the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from gpu_utils import capture
from marketrl.agents import dqn, ppo
from marketrl.env import EnvConfig, MarketData

N_ENVS = 64
SEEDS = [0, 1, 2, 3, 4]
HPARAMS = {
    "ppo": {"hidden_dim_base": 64, "n_steps": 128, "batch_size": 1024, "n_epochs": 4},
    "dqn": {"hidden_dim_base": 64, "learning_starts": 1024, "batch_size": 256},
}
QUICK_HPARAMS = {
    "ppo": {"hidden_dim_base": 16, "n_steps": 16, "batch_size": 256, "n_epochs": 2},
    "dqn": {"hidden_dim_base": 16, "learning_starts": 128, "batch_size": 32},
}


def market_data(n_bars: int) -> MarketData:
    from batch_folds import fold_data  # bench/speed/batch_folds.py (this script runs from bench/speed/)

    return fold_data(1, n_bars)[0]


class Compiled:
    """Within ``with Compiled():`` every `CapturedCall` built compiles its function."""

    def __enter__(self) -> None:
        self.original = capture.CapturedCall.__init__
        original = self.original

        def init(call: capture.CapturedCall, fn: Any, device: Any, **options: Any) -> None:
            original(call, torch.compile(fn), device, **options)

        capture.CapturedCall.__init__ = init  # type: ignore[method-assign]

    def __exit__(self, *exc: object) -> None:
        capture.CapturedCall.__init__ = self.original  # type: ignore[method-assign]


def run(algo: str, data: MarketData, steps: int, hparams: dict[str, Any], compiled: bool) -> dict[str, Any]:
    module = dqn if algo == "dqn" else ppo
    config_cls = dqn.DQNConfig if algo == "dqn" else ppo.PPOConfig
    config = config_cls(total_steps=steps, env=EnvConfig(n_envs=N_ENVS, max_gap=None))
    if compiled:
        torch._dynamo.reset()  # each run compiles its own closures afresh (what a new train job would do)
    started = time.perf_counter()
    if compiled:
        with Compiled():
            results = module.train_seeds(data, config, hparams, "fp32", "cpu", SEEDS)
    else:
        results = module.train_seeds(data, config, hparams, "fp32", "cpu", SEEDS)
    return {
        "wall_s": time.perf_counter() - started,
        "env_steps": results[0].log["env_steps"],
        "weights": [
            t.clone() for r in results for net in r.networks.values() for t in net.state_dict().values()
        ],
    }


def bench(
    algo: str, lengths: tuple[int, int], hparams: dict[str, Any], data: MarketData, tolerance: float
) -> dict:
    short, long = lengths
    eager_short = run(algo, data, short, hparams, compiled=False)
    cold = run(algo, data, short, hparams, compiled=True)
    warm = run(algo, data, short, hparams, compiled=True)
    eager_long = run(algo, data, long, hparams, compiled=False)
    compiled_long = run(algo, data, long, hparams, compiled=True)
    # equal work at the short length: over many more steps fused sums drift apart, as any reordering does
    difference = max(
        (a - b).abs().max().item() for a, b in zip(eager_short["weights"], warm["weights"], strict=True)
    )
    extra_steps = eager_long["env_steps"] - eager_short["env_steps"]
    eager_per_step = (eager_long["wall_s"] - eager_short["wall_s"]) / extra_steps
    compiled_per_step = (compiled_long["wall_s"] - warm["wall_s"]) / extra_steps
    saving = eager_per_step - compiled_per_step
    cost = {"cold": cold["wall_s"] - eager_short["wall_s"], "warm": warm["wall_s"] - eager_short["wall_s"]}
    return {
        "algo": algo,
        "env_steps": [eager_short["env_steps"], eager_long["env_steps"]],
        "eager_wall_s": [eager_short["wall_s"], eager_long["wall_s"]],
        "compiled_wall_s": {"cold": cold["wall_s"], "warm": warm["wall_s"], "long": compiled_long["wall_s"]},
        "compile_cost_s": cost,
        "speedup_per_step": eager_per_step / compiled_per_step if compiled_per_step > 0 else None,
        "pays_after_env_steps": {k: (v / saving if saving > 0 else None) for k, v in cost.items()},
        "max_weight_difference": difference,
        "same_work": compiled_long["env_steps"] == eager_long["env_steps"]
        and warm["env_steps"] == eager_short["env_steps"]
        and difference <= tolerance,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=("ppo", "dqn"), default=["ppo", "dqn"])
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest weight difference allowed")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a check")
    args = parser.parse_args()
    # an empty inductor cache of its own: the first compile is cold, as in a fresh clone or CI
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-bench-")
    torch.set_num_threads(1)
    hparams = QUICK_HPARAMS if args.quick else HPARAMS
    data = market_data(4_000 if args.quick else 20_000)
    lengths = {
        "ppo": (2 * N_ENVS * hparams["ppo"]["n_steps"], 4 * N_ENVS * hparams["ppo"]["n_steps"]),
        "dqn": tuple(
            hparams["dqn"]["learning_starts"] + k * N_ENVS for k in ((8, 16) if args.quick else (64, 320))
        ),
    }
    try:
        torch.compile(lambda x: x + 1)(torch.zeros(2))
    except Exception as error:  # inductor needs a C++ compiler: say why and stop
        print(f"compile unavailable here: {type(error).__name__}: {str(error).splitlines()[0]}")
        return
    rows = [bench(algo, lengths[algo], hparams[algo], data, args.tolerance) for algo in args.only]
    print(
        "| algo | env steps a seed (short, long) | eager s | compile cost s: cold / warm | speed-up per step "
        "| pays after env steps a seed: cold / warm | max weight diff | same work |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        pays = row["pays_after_env_steps"]
        print(
            f"| {row['algo']} | {row['env_steps'][0]:,}, {row['env_steps'][1]:,} "
            f"| {row['eager_wall_s'][0]:.2f}, {row['eager_wall_s'][1]:.2f} "
            f"| {row['compile_cost_s']['cold']:.1f} / {row['compile_cost_s']['warm']:.1f} "
            f"| {_ratio(row['speedup_per_step'])} "
            f"| {_steps(pays['cold'])} / {_steps(pays['warm'])} "
            f"| {row['max_weight_difference']:.1e} | {'yes' if row['same_work'] else 'NO'} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    if not all(row["same_work"] for row in rows):
        raise SystemExit("unequal work: the compiled run did not end where the eager run did")


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _steps(value: float | None) -> str:
    return "never" if value is None else f"{value:,.0f}"


if __name__ == "__main__":
    main()
