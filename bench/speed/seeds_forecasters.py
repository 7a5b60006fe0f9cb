"""The forecasters' part of bench/speed/seeds.py: S seeds of a neural forecaster trained in one batched call vs S
single-seed calls (issue 24). A module of seeds.py, not run alone:

    python bench/speed/seeds.py --only forecasters --forecasters mlp lstm --json seeds.json

Side by side in one process, at demo sizes (hidden_dim_base 64, window 16, batch 256, 51 features), on the CPU
with `torch.set_num_threads(1)`: for each model and S, **batched** is one `MODELS[name].train_seeds(..., seeds)`
call (the S seeds as one vmapped computation) and **sequential** is S `MODELS[name].train_seeds(..., [seed])` calls, both
the real calls the pipeline makes, each running exactly ``steps`` optimizer steps per seed (``max_steps``, no
validation). The two sides alternate (sequential first at even S positions) so that load drifts hit both.

Reported per model and S: CPU seconds (`time.process_time`) and wall seconds of each side, and the speed-up
ratios sequential / batched (above 1: batching pays). One untimed warm-up call per model runs first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from marketrl.env import MarketData
from marketrl.instruments.costs import CostModel
from marketrl.models import MODELS, RunSettings

DEMO = {"hidden_dim_base": 64, "window": 16, "batch_size": 256}
N_FEATURES = 51


def synthetic_split(rows: int, seed: int = 0) -> MarketData:
    """One instrument of ``rows`` one-minute bars with 51 standard-normal features (the demo's feature count)."""
    rng = np.random.default_rng(seed)
    close = 100.0 * np.cumprod(1.0 + rng.normal(0.0, 5e-4, rows))
    return MarketData.from_arrays(
        features=rng.normal(size=(rows, N_FEATURES)).astype(np.float32),
        opens=close,
        closes=close,
        instrument_id=np.ones(rows, dtype=np.int64),
        ts_event_ns=1_704_153_600 * 10**9 + np.arange(rows, dtype=np.int64) * 60 * 10**9,
        cost_model=CostModel(kind="bps", bps=1.0),
        max_gap=None,
    )


def _clock(run: Callable[[], Any]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    run()
    return time.process_time() - cpu, time.perf_counter() - wall


def bench_forecasters(
    s_values: Sequence[int] = (1, 2, 5),
    steps: int = 20,
    models: Sequence[str] = ("mlp", "lstm", "transformer"),
    rows: int = 4096,
) -> list[dict[str, Any]]:
    """One row per model and S: CPU and wall seconds of the batched call and of S sequential calls, and the
    ratios sequential / batched. Sets torch to one thread for the duration."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = synthetic_split(rows)
        settings = RunSettings(epochs=10_000, max_steps=steps, check_every=steps)
        results = []
        for name in models:
            spec = MODELS[name]
            spec.train_seeds(data, None, RunSettings(max_steps=2, check_every=2), DEMO, "fp32", "cpu", [0, 1])
            for position, n_seeds in enumerate(s_values):
                seeds = list(range(n_seeds))

                def batched(seeds: list[int] = seeds, spec: Any = spec) -> None:
                    models = spec.train_seeds(data, None, settings, DEMO, "fp32", "cpu", seeds)
                    assert all(model.log["steps"] == steps for model in models)

                def sequential(seeds: list[int] = seeds, spec: Any = spec) -> None:
                    for seed in seeds:
                        assert (
                            spec.train_seeds(data, None, settings, DEMO, "fp32", "cpu", [seed])[0].log[
                                "steps"
                            ]
                            == steps
                        )

                if position % 2 == 0:
                    seq, bat = _clock(sequential), _clock(batched)
                else:
                    bat, seq = _clock(batched), _clock(sequential)
                results.append(
                    {
                        "model": name,
                        "seeds": n_seeds,
                        "steps": steps,
                        "batched_cpu_s": bat[0],
                        "batched_wall_s": bat[1],
                        "sequential_cpu_s": seq[0],
                        "sequential_wall_s": seq[1],
                        "speedup_cpu": seq[0] / bat[0],
                        "speedup_wall": seq[1] / bat[1],
                    }
                )
        return results
    finally:
        torch.set_num_threads(previous)


def table(results: list[dict[str, Any]]) -> str:
    """The results as a Markdown table."""
    lines = [
        "| model | S | batched CPU s | sequential CPU s | speed-up CPU | batched wall s | sequential wall s | "
        "speed-up wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['model']} | {r['seeds']} | {r['batched_cpu_s']:.2f} | {r['sequential_cpu_s']:.2f} | "
            f"{r['speedup_cpu']:.2f}x | {r['batched_wall_s']:.2f} | {r['sequential_wall_s']:.2f} | "
            f"{r['speedup_wall']:.2f}x |"
        )
    return "\n".join(lines)
