"""Benchmark: wall time until validation Sharpe first reaches half the oracle's, marketrl vs Stable-Baselines3.

    .venv/bin/python bench/speed/time_to_quality.py                      # PPO and DQN, 30 demo days at edge 10
    .venv/bin/python bench/speed/time_to_quality.py --algos ppo --cap-seconds 30 --eval-every 65536
    .venv/bin/python bench/speed/time_to_quality.py --quick          # 6 days, tiny budgets: a sanity run
    .venv/bin/python bench/speed/time_to_quality.py --skip-sb3       # marketrl only (no bench extra)

Data: `--days` demo days with a planted edge (`marketrl.data.demo`, docs/DEMO_DATA.md), featurized with
`build_feature_file` as the pipeline does; the last `--validation-days` are the validation split, the rest the
training split, normalized on the training rows (`marketrl.splits.datasets.build_window`, the schema's defaults for
env and costs, with each instrument's contract spec from the demo's definition file, as `data.definitions`). The oracle holds sign(ret_15) in each instrument; its realized Sharpe on the validation split
(`evaluate_positions`) sets the threshold: `--fraction` (0.5) of it.

Runs: the ppo-64 / dqn-64 configurations of bench/speed/agents.py, through its `run_marketrl` and `run_sb3`, so both
libraries get exactly the hyperparameters, networks and env adapter of the throughput benchmark. Every
`--eval-every` env steps (the same K for both; PPO after an update, DQN after a vector step's gradient steps)
the greedy policy is scored with `marketrl.evaluation.evaluate.validation_sharpe`; SB3's through `model.predict`. A run
stops at the threshold, after `--cap-seconds` of training, or at its step budget (`--max-steps`, which also sets
the schedules: DQN's exploration decays over a fraction of it). Times are training wall time: the
evaluations (the same function for both) are timed separately and left out. Torch at 1 thread, CPU.
Stable-Baselines3 (the ``bench`` extra) is imported only for its side; `--skip-sb3` runs marketrl alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import agents  # bench/speed/agents.py (a sibling: this script runs from bench/speed/): the configurations, the runs
import numpy as np
import polars as pl
import torch

from marketrl.agents import dqn, ppo
from marketrl.data.definitions import demo_run_config
from marketrl.data.demo import EDGE_KINDS, edge_coefficient, generate_demo_files
from marketrl.env import EnvConfig, MarketData, Policy, evaluate_positions
from marketrl.evaluation.evaluate import validation_sharpe
from marketrl.features import build_feature_file
from marketrl.loop.schedule import EvalSchedule
from marketrl.scoring.metrics import performance_summary
from marketrl.splits.datasets import build_window, env_config_from_config, load_feature_tables

CASE_OF_ALGO = {"ppo": "ppo-64", "dqn": "dqn-64"}
# Per-algorithm defaults: PPO-64 evaluates every 8 updates (of 8,192 env steps), DQN-64 every 512 vector steps.
DEFAULT_EVAL_EVERY = {"ppo": 65_536, "dqn": 32_768}
DEFAULT_MAX_STEPS = {"ppo": 20_000_000, "dqn": 500_000}
# --quick: an evaluation after each PPO update and every 16 DQN vector steps; two updates, 40 vector steps
QUICK_EVAL_EVERY = {"ppo": 8_192, "dqn": 1_024}
QUICK_MAX_STEPS = {"ppo": 16_384, "dqn": 1_024 + 40 * 64}
LIBRARIES = ("marketrl", "sb3")


# ------------------------------------------------------------------------------------------------------- data


@dataclass
class Splits:
    """The training and validation splits, the env settings and the oracle's validation Sharpe."""

    train: MarketData
    validation: MarketData
    env: EnvConfig
    oracle_sharpe: float
    train_days: int
    validation_days: int


def build_splits(
    workdir: Path, days: int, validation_days: int, edge: float, seed: int, edge_kind: str = "momentum"
) -> Splits:
    """Demo files -> feature tables -> train/validation MarketData (normalizer fit on the training days). The
    oracle holds sign · sign(ret_L) of the edge kind (momentum: +ret_15; reversion: −ret_5; `EDGE_KINDS`)."""
    raw = generate_demo_files(workdir / "raw", "2024-01-02", days, seed=seed, edge=edge, edge_kind=edge_kind)
    tables = []
    for i, path in enumerate(raw):
        out = workdir / "features" / path.name.replace(".dbn.zst", ".parquet")
        build_feature_file(path, out, prev_src=raw[i - 1] if i else None)  # lookbacks cross the day boundary
        tables.append(out)
    table = load_feature_tables(tables)
    trading_days = table["trading_day"].unique().sort()
    if not 0 < validation_days < trading_days.len():
        raise SystemExit(f"--validation-days: expected 1..{trading_days.len() - 1}, got {validation_days}")
    first_validation_day = trading_days[-validation_days]
    frames = {
        "train": table.filter(pl.col("trading_day") < first_validation_day),
        "validation": table.filter(pl.col("trading_day") >= first_validation_day),
    }
    config = demo_run_config(workdir / "raw")
    window = build_window(table, frames, config, "cpu")
    env = env_config_from_config(config)
    validation = window.splits["validation"]
    # MarketData row t is frame row t (both sorted by instrument, time): the oracle's position at the close of t.
    lookback, sign = EDGE_KINDS[edge_kind]
    oracle = sign * np.sign(frames["validation"][f"ret_{lookback}"].to_numpy())
    oracle_sharpe = performance_summary(evaluate_positions(validation, oracle, env))["sharpe"]
    return Splits(
        window.splits["train"],
        validation,
        env,
        float(oracle_sharpe),
        trading_days.len() - validation_days,
        validation_days,
    )


# ------------------------------------------------------------------------------------------ timing to a score


class Stop(Exception):
    """Raised from an evaluation to end a run: the threshold was reached or the time cap passed."""


@dataclass
class QualityClock:
    """The evaluation callback of one run: scores the greedy policy on the validation split, keeps training wall
    time (evaluations excluded), and raises `Stop` at the threshold or once training time passes the cap."""

    splits: Splits
    threshold: float
    cap_seconds: float
    started: float = 0.0
    eval_seconds: float = 0.0
    records: list[tuple[int, float, float]] = field(default_factory=list)  # (env steps, training s, Sharpe)
    reached: bool = False

    def start(self) -> None:
        """Start the clock (before the env and the networks are built: both sides pay their set-up)."""
        self.started = time.perf_counter()

    def __call__(self, env_steps: int, policy: Policy) -> float:
        """Score `policy` after `env_steps` env steps; raise `Stop` when the run is over."""
        began = time.perf_counter()
        training_seconds = began - self.started - self.eval_seconds
        sharpe = validation_sharpe(policy, self.splits.validation, self.splits.env)
        self.eval_seconds += time.perf_counter() - began
        self.records.append((env_steps, training_seconds, sharpe))
        print(f"  {env_steps:>10,} steps  {training_seconds:7.1f} s  Sharpe {sharpe:6.2f}", file=sys.stderr)
        if sharpe >= self.threshold:
            self.reached = True
            raise Stop
        if training_seconds >= self.cap_seconds:
            raise Stop
        return sharpe


def sb3_evaluations(clock: QualityClock, every: int) -> Any:
    """An SB3 callback that calls the `QualityClock` on the schedule marketrl's trainers use (`EvalSchedule`), at
    the start of each rollout collection, i.e. right after the previous update; and once at the end of training."""
    from stable_baselines3.common.callbacks import BaseCallback

    class SB3Evaluations(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.schedule = EvalSchedule(clock, every)

        def _greedy(self, obs: torch.Tensor) -> torch.Tensor:
            actions, _ = self.model.predict(obs.cpu().numpy(), deterministic=True)
            return torch.as_tensor(actions, dtype=torch.long, device=obs.device).reshape(-1)

        def _on_rollout_start(self) -> None:
            self.schedule.maybe(self.model.num_timesteps, self._greedy)

        def _on_step(self) -> bool:
            return True

        def _on_training_end(self) -> None:
            self.schedule.final(self.model.num_timesteps, self._greedy)

    return SB3Evaluations()


@contextmanager
def evaluated(library: str, clock: QualityClock, every: int) -> Iterator[None]:
    """Route `clock` into the runs of bench/speed/agents.py, which take no evaluation hook: marketrl's trainers get
    it as `on_eval` (and `eval_every`), SB3's `learn` as a callback. Patched for this block only, so that the
    runs are exactly those of the throughput benchmark (same hyperparameter mapping, no copy of it here)."""
    if library == "marketrl":
        patches = [
            mock.patch.object(module, "train_seeds", _with_on_eval(module.train_seeds, clock, every))
            for module in (ppo, dqn)
        ]
    else:
        import stable_baselines3

        patches = [
            mock.patch.object(
                stable_baselines3, name, _with_callback(getattr(stable_baselines3, name), clock, every)
            )
            for name in ("PPO", "DQN")
        ]
    with patches[0], patches[1]:
        yield


def _with_on_eval(train_seeds: Callable[..., Any], clock: QualityClock, every: int) -> Callable[..., Any]:
    """``train_seeds`` of one seed with the clock as its ``on_eval`` (a batch of one: one policy, one score)."""

    def on_eval(env_steps: int, policies: list[Policy]) -> list[float]:
        (policy,) = policies
        return [clock(env_steps, policy)]

    def train_evaluated(data: MarketData, config: Any, *args: Any) -> Any:
        return train_seeds(data, dataclasses.replace(config, eval_every=every), *args, on_eval=on_eval)

    return train_evaluated


def _with_callback(algorithm: type, clock: QualityClock, every: int) -> type:
    class Evaluated(algorithm):  # type: ignore[misc, valid-type]
        def learn(self, *args: Any, **kwargs: Any) -> Any:
            return super().learn(*args, callback=sb3_evaluations(clock, every), **kwargs)

    return Evaluated


@dataclass
class Outcome:
    """One run's result."""

    library: str
    reached: bool
    seconds: float  # training wall time at the threshold, or when the run stopped
    env_steps: int  # at the threshold, or when the run stopped
    best_sharpe: float
    best_at: int
    evals: int
    eval_seconds: float


def time_to_quality(
    library: str, case: agents.Case, splits: Splits, threshold: float, cap: float, every: int, steps: int
) -> Outcome:
    """Train `case` with `library` until the validation Sharpe reaches `threshold` (or the cap / budget)."""
    clock = QualityClock(splits, threshold, cap)
    env = dataclasses.replace(splits.env, n_envs=case.n_envs)
    run = agents.run_marketrl if library == "marketrl" else agents.run_sb3
    print(f"{case.name} {library}:", file=sys.stderr)
    with evaluated(library, clock, every):
        clock.start()
        try:
            run(case, splits.train, env, steps)
        except Stop:
            pass
    env_steps, seconds, _ = clock.records[-1]
    best_steps, _, best = max(clock.records, key=lambda record: record[2])
    return Outcome(
        library, clock.reached, seconds, env_steps, best, best_steps, len(clock.records), clock.eval_seconds
    )


def warm_up(algo: str, splits: Splits, libraries: tuple[str, ...]) -> None:
    """First calls pay for lazy initialisation (torch kernels, cached episode starts): a tiny run of each side."""
    base = next(case for case in agents.CASES if case.name == CASE_OF_ALGO[algo])
    small = {"n_steps": 16, "batch_size": 64} if algo == "ppo" else {"batch_size": 64, "learning_starts": 64}
    warm = agents.Case("warm-up", algo, 8, {**base.hparams, **small}, 1, 1)
    env = dataclasses.replace(splits.env, n_envs=warm.n_envs)
    agents.run_marketrl(warm, splits.train, env, agents.total_steps(warm, 2))
    if "sb3" in libraries:
        agents.run_sb3(warm, splits.train, env, agents.total_steps(warm, 2))


# ------------------------------------------------------------------------------------------------------- main


def _ratio(ours: Outcome, theirs: Outcome) -> str:
    """marketrl / SB3 time to threshold; a bound where one side stopped without reaching it."""
    if ours.reached and theirs.reached:
        return f"{ours.seconds / theirs.seconds:.2f}"
    if ours.reached:
        return f"< {ours.seconds / theirs.seconds:.2f}"
    if theirs.reached:
        return f"> {ours.seconds / theirs.seconds:.2f}"
    return "n/a (neither reached)"


def _row(config: str, outcome: Outcome, cap: float, ratio: str) -> str:
    reached = f"{outcome.seconds:.1f} s" if outcome.reached else f"not in {cap:g} s"
    steps = f"{outcome.env_steps:,}" if outcome.reached else "-"
    return (
        f"{config:<7} | {outcome.library:<8} | {reached:>17} | {steps:>9} | "
        f"{outcome.best_sharpe:>6.2f} at {outcome.best_at:>10,} | "
        f"{outcome.seconds:>5.1f} s, {outcome.env_steps:>10,} | {outcome.evals:>3} ({outcome.eval_seconds:4.1f} s) | "
        f"{ratio}"
    )


def main() -> None:
    """Build the data, run the chosen algorithms with both libraries and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=30, help="demo trading days in all")
    parser.add_argument("--validation-days", type=int, default=10, help="the last days, the validation split")
    parser.add_argument(
        "--edge", type=float, default=10.0, help="planted edge: the oracle's calibrated Sharpe"
    )
    parser.add_argument("--seed", type=int, default=7, help="demo data seed")
    parser.add_argument("--cap-seconds", type=float, default=60.0, help="training wall time cap per run")
    parser.add_argument(
        "--eval-every", type=int, default=None, help="env steps between evaluations (both sides)"
    )
    parser.add_argument(
        "--max-steps", type=int, default=None, help="step budget per run (default per algorithm)"
    )
    parser.add_argument("--fraction", type=float, default=0.5, help="threshold as a fraction of the oracle")
    parser.add_argument("--algos", nargs="+", choices=sorted(CASE_OF_ALGO), default=["ppo", "dqn"])
    parser.add_argument(
        "--skip-sb3", action="store_true", help="marketrl only (Stable-Baselines3 not needed)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a sanity run in seconds: 6 days, 2 s cap, tiny step budgets"
    )
    args = parser.parse_args()
    if args.quick:  # an explicit value beats the mode's default
        args.days = 6 if args.days == parser.get_default("days") else args.days
        args.validation_days = (
            2 if args.validation_days == parser.get_default("validation_days") else args.validation_days
        )
        args.cap_seconds = 2.0 if args.cap_seconds == parser.get_default("cap_seconds") else args.cap_seconds
    libraries = ("marketrl",) if args.skip_sb3 else LIBRARIES
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="time-to-quality-") as tmp:
        splits = build_splits(Path(tmp), args.days, args.validation_days, args.edge, args.seed)
    threshold = args.fraction * splits.oracle_sharpe
    if not threshold > 0:
        raise SystemExit(
            f"the oracle's validation Sharpe is {splits.oracle_sharpe:.2f}: no positive threshold"
        )

    results: dict[str, dict[str, Outcome]] = {}
    for algo in args.algos:
        case = next(case for case in agents.CASES if case.name == CASE_OF_ALGO[algo])
        every = args.eval_every or (QUICK_EVAL_EVERY if args.quick else DEFAULT_EVAL_EVERY)[algo]
        steps = args.max_steps or (QUICK_MAX_STEPS if args.quick else DEFAULT_MAX_STEPS)[algo]
        warm_up(algo, splits, libraries)
        results[algo] = {
            library: time_to_quality(library, case, splits, threshold, args.cap_seconds, every, steps)
            for library in libraries
        }

    sb3 = "not run" if args.skip_sb3 else importlib.metadata.version("stable-baselines3")
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, SB3 {sb3}; "
        f"demo edge {args.edge:g} (phi {edge_coefficient(args.edge):.4f}), seed {args.seed}, "
        f"{splits.train_days} train + {splits.validation_days} validation days"
    )
    print(
        f"oracle sign(ret_15) validation Sharpe {splits.oracle_sharpe:.2f} (calibrated {args.edge:g}); "
        f"threshold {args.fraction:g} x = {threshold:.2f}; cap {args.cap_seconds:g} s of training per run; "
        f"load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    header = (
        f"{'config':<7} | {'library':<8} | {'time to threshold':>17} | {'env steps':>9} | "
        f"{'best Sharpe at steps':>20} | {'trained (s, steps)':>20} | {'evals (time)':>12} | marketrl / SB3 time"
    )
    print(header)
    print("-" * len(header))
    for algo, outcomes in results.items():
        ours, theirs = outcomes["marketrl"], outcomes.get("sb3")
        ratio = _ratio(ours, theirs) if theirs else "n/a (SB3 not run)"
        print(_row(CASE_OF_ALGO[algo], ours, args.cap_seconds, ratio))
        if theirs:
            print(_row(CASE_OF_ALGO[algo], theirs, args.cap_seconds, ""))


if __name__ == "__main__":
    main()
