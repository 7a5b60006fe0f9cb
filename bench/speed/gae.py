"""Benchmark: PPO's GAE and rollout statistics on the host (one copy + numpy) against on the device (torch scan).

    .venv/bin/python bench/speed/gae.py                       # CPU; columns 256 .. 262,144, T = 64
    .venv/bin/python bench/speed/gae.py --device cuda         # the crossover on an accelerator
    .venv/bin/python bench/speed/gae.py --quick               # two sizes, a check

Both sides are the trainer's own functions (`marketrl.agents.ppo.gae_on_host` / `gae_on_device`) on the same
synthetic rollout [T, C] (C = S·N columns: S seeds of N envs; episodes end with probability 1/64 a step, a
fifth of them truncated), side by side in one process, interleaved, each timed as the median of ``--repeats``
calls (on CUDA, synchronized after each call, the host side's copy included). Before timing, the two sides'
advantages, returns and statistics are checked equal (the same float64 operations in the same order). Reported: ms
per rollout of each and host / device (> 1: the device path is faster), which `gpu_utils.gae_place` follows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marketrl.agents.ppo import GaeInputs, PPOHyperparams, gae_on_device, gae_on_host

SEEDS = 4
STEPS = 64


def rollout(columns: int, device: torch.device, seed: int = 0) -> GaeInputs:
    """A synthetic rollout [T, C] with episode ends of both kinds."""
    generator = torch.Generator().manual_seed(seed)
    shape = (STEPS, columns)
    ended = torch.rand(shape, generator=generator) < 1 / 64
    truncated = ended & (torch.rand(shape, generator=generator) < 0.2)
    tables = [torch.randn(shape, generator=generator) for _ in range(3)]
    return GaeInputs(*(table.to(device) for table in (*tables, ended & ~truncated, truncated)))


def timed(call: Callable[..., Any], device: torch.device, *args: Any) -> float:
    start = time.perf_counter()
    call(*args)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def check_equal(inputs: GaeInputs, hp: PPOHyperparams) -> None:
    """The two sides compute the same advantages, returns, statistics and running returns."""
    running = np.random.default_rng(0).normal(size=inputs.rewards.shape[1])
    host = gae_on_host(inputs, running, hp, SEEDS)
    device = gae_on_device(inputs, running, hp, SEEDS)
    if not torch.equal(host[0], device[0]):
        raise SystemExit("unequal work: the two sides' advantages or returns differ")
    for before, after in zip(host[1], device[1], strict=True):
        if before.episodes != after.episodes or not np.allclose(
            [v for v in before if v is not None], [v for v in after if v is not None], rtol=1e-9
        ):
            raise SystemExit(f"unequal work: statistics {before} vs {after}")
    if not np.allclose(host[2], device[2].cpu().numpy(), rtol=1e-12, atol=1e-12):
        raise SystemExit("unequal work: running returns differ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--columns", type=int, nargs="+", default=[256, 1024, 4096, 16384, 65536, 262144])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--quick", action="store_true", help="256 and 4,096 columns, 3 repeats: a check")
    args = parser.parse_args()
    if args.quick:
        args.columns, args.repeats = [256, 4096], 3
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    hp = PPOHyperparams()
    rows = []
    print(f"GAE + rollout statistics, T = {STEPS}, S = {SEEDS}, on {device}")
    print("| columns (S·N) | host ms | device ms | host / device |")
    print("|---|---|---|---|")
    for columns in args.columns:
        columns -= columns % SEEDS
        inputs = rollout(columns, device)
        check_equal(inputs, hp)
        running = np.zeros(columns)
        times: dict[str, list[float]] = {"host": [], "device": []}
        for _ in range(args.repeats):  # interleaved: a load change hits both sides alike
            times["host"].append(timed(gae_on_host, device, inputs, running, hp, SEEDS))
            times["device"].append(timed(gae_on_device, device, inputs, running, hp, SEEDS))
        host_ms, device_ms = (1e3 * statistics.median(times[side]) for side in ("host", "device"))
        rows.append(
            {"columns": columns, "host_ms": host_ms, "device_ms": device_ms, "ratio": host_ms / device_ms}
        )
        print(f"| {columns:,} | {host_ms:.2f} | {device_ms:.2f} | {host_ms / device_ms:.2f} |", flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"device": str(device), "steps": STEPS, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
