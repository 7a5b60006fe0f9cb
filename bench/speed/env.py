"""Benchmark: TradingEnv (batched tensors) vs PlainGymEnv (one numpy env stepped N times) on the same data.

    python bench/speed/env.py                      # CPU, torch at 1 thread, N = 1, 64, 1024
    python bench/speed/env.py --device cuda --n-envs 1024 4096
    python bench/speed/env.py --quick              # 20,000 bars, N = 1 and 64, 0.1 s per measurement

Prints env steps/s (environment transitions per second, N per vector step) side by side and their ratio.
The plain baseline runs on the CPU in both cases; its steps/s do not depend on N. Before anything is timed,
``check_same_work`` steps TradingEnv and PlainGymEnv copies from the same start rows with the same actions over
two episodes and stops with one line unless every observation, reward and truncation agrees.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import gymnasium
import numpy as np
import polars as pl
import torch

ROOT = Path(__file__).resolve().parents[2]
# run as `python bench/speed/env.py`: sys.path holds bench/speed/, not the checkout that tests.support is in
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from marketrl.env import EnvConfig, MarketData, TradingEnv  # noqa: E402
from marketrl.instruments.costs import CostModel  # noqa: E402
from marketrl.splits.normalize import FeatureNormalizer  # noqa: E402
from tests.support.adapters import PlainGymEnv  # noqa: E402


def synthetic_frame(n_bars: int, n_features: int, n_instruments: int = 2, seed: int = 0) -> pl.DataFrame:
    """Minute bars 00:00–22:00 UTC on weekdays with random-walk prices and random float32 features."""
    rng = np.random.default_rng(seed)
    per_instrument = n_bars // n_instruments
    minutes = np.arange(per_instrument)
    session_minutes = 22 * 60
    day_index = minutes // session_minutes
    weekday_days = day_index + 2 * (day_index // 5)  # skip Saturdays and Sundays
    start = datetime(2024, 1, 1, tzinfo=UTC)  # a Monday
    ts = [
        start + timedelta(days=int(d), minutes=int(m))
        for d, m in zip(weekday_days, minutes % session_minutes, strict=True)
    ]
    frames = []
    for instrument in range(n_instruments):
        close = 4000.0 * np.exp(np.cumsum(rng.normal(0.0, 5e-4, per_instrument)))
        opens = np.append(close[0], close[:-1])
        frames.append(
            pl.DataFrame(
                {
                    "ts_event": pl.Series(ts, dtype=pl.Datetime("ns", "UTC")),
                    "trading_day": pl.Series([t.date() for t in ts], dtype=pl.Date),
                    "instrument_id": pl.Series([instrument + 1] * per_instrument, dtype=pl.UInt32),
                    "symbol": [f"SYM{instrument}"] * per_instrument,
                    "open": opens,
                    "close": close,
                    **{
                        f"f{j}": rng.normal(0.0, 1.0, per_instrument).astype(np.float32)
                        for j in range(n_features)
                    },
                }
            )
        )
    return pl.concat(frames)


def tensor_steps_per_second(env: TradingEnv, n_steps: int) -> float:
    """Env transitions per second of `env.step` with actions drawn on the device."""
    generator = torch.Generator(device=env.device).manual_seed(0)
    actions = torch.randint(0, 3, (n_steps, env.n_envs), generator=generator, device=env.device)
    env.reset()
    for step in range(min(10, n_steps)):  # warm-up
        env.step(actions[step])
    synchronize(env.device)
    started = time.perf_counter()
    for step in range(n_steps):
        env.step(actions[step])
    synchronize(env.device)
    return n_steps * env.n_envs / (time.perf_counter() - started)


def plain_steps_per_second(env: PlainGymEnv, n_steps: int) -> float:
    """Transitions per second of one PlainGymEnv (reset on truncation, as a vector wrapper would)."""
    actions = np.random.default_rng(0).integers(0, 3, n_steps)
    env.reset(seed=0)
    started = time.perf_counter()
    for action in actions:
        _, _, terminated, truncated, _ = env.step(int(action))
        if terminated or truncated:
            env.reset()
    return n_steps / (time.perf_counter() - started)


def sync_vector_steps_per_second(envs: gymnasium.vector.SyncVectorEnv, seconds: float) -> float:
    """Transitions per second of gymnasium's SyncVectorEnv over PlainGymEnv copies (same-step autoreset)."""
    rng = np.random.default_rng(0)
    envs.reset(seed=0)
    n_steps, elapsed = 0, 0.0
    started = time.perf_counter()
    while elapsed < seconds or n_steps < 3:
        envs.step(rng.integers(0, 3, envs.num_envs))
        n_steps += 1
        elapsed = time.perf_counter() - started
    return n_steps * envs.num_envs / elapsed


class UnequalWork(SystemExit):
    """The two environments did not make the same transitions: one line naming the first difference."""

    def __init__(self, what: str) -> None:
        super().__init__(f"bench/speed/env.py: unequal work: {what}")


def check_same_work(data: MarketData, config: EnvConfig, n_envs: int = 4, seed: int = 0) -> int:
    """TradingEnv (``n_envs``) and as many PlainGymEnvs from the same start rows, stepped with the same random
    actions over two episodes (one reset included): the same observations, rewards and truncations, else
    ``UnequalWork``. Returns the transitions compared."""
    tensor = TradingEnv(data, EnvConfig(**{**config.__dict__, "n_envs": n_envs}), seed=seed)
    obs = tensor.reset().cpu().numpy()
    plains = [PlainGymEnv(data, config) for _ in range(n_envs)]
    plain_obs = [p.reset(options={"start_row": int(tensor.row[i])})[0] for i, p in enumerate(plains)]
    rng = np.random.default_rng(seed)
    steps = 2 * config.episode_length + 1
    for step in range(steps):
        for i in range(n_envs):
            if not np.allclose(plain_obs[i], obs[i], rtol=1e-6, atol=1e-6):
                raise UnequalWork(f"step {step}, env {i}: observations differ (TradingEnv vs PlainGymEnv)")
        actions = rng.integers(0, 3, n_envs)
        obs_t, reward_t, _, truncated_t = tensor.step(torch.as_tensor(actions, device=tensor.device))
        obs, reward, truncated = (t.cpu().numpy() for t in (obs_t, reward_t, truncated_t))
        for i, plain in enumerate(plains):
            plain_obs[i], plain_reward, _, plain_truncated, _ = plain.step(int(actions[i]))
            if abs(plain_reward - float(reward[i])) > 1e-6 * max(1.0, abs(plain_reward)):
                raise UnequalWork(f"step {step}, env {i}: reward {float(reward[i])!r} vs {plain_reward!r}")
            if plain_truncated != bool(truncated[i]):
                raise UnequalWork(
                    f"step {step}, env {i}: truncated {bool(truncated[i])} vs {plain_truncated}"
                )
            if plain_truncated:
                plain_obs[i], _ = plain.reset(options={"start_row": int(tensor.row[i])})
    return steps * n_envs


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (CUDA) before reading the clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n-envs", type=int, nargs="+", default=None, help="default 1 64 1024 (quick 1 64)")
    parser.add_argument("--bars", type=int, default=None, help="default 200,000 (quick 20,000)")
    parser.add_argument("--features", type=int, default=51)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--fill", default="close", choices=["close", "next_open"])
    parser.add_argument("--seconds", type=float, default=None, help="time per measurement (1 s; quick 0.1)")
    parser.add_argument("--quick", action="store_true", help="small sizes, a sanity run in seconds")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    args.n_envs = args.n_envs or ([1, 64] if args.quick else [1, 64, 1024])
    args.bars = args.bars or (20_000 if args.quick else 200_000)
    args.seconds = args.seconds or (0.1 if args.quick else 1.0)
    torch.set_num_threads(args.threads)

    frame = synthetic_frame(args.bars, args.features)
    names = [f"f{j}" for j in range(args.features)]
    normalizer = FeatureNormalizer().fit(frame, names)
    costs = CostModel(
        kind="futures", commission_per_contract=2.0, half_spread_ticks=0.5, tick_size=0.25, tick_value=12.5
    )
    data = MarketData.from_frame(frame, names, normalizer, costs, device=args.device)

    base = EnvConfig(window=args.window, fill=args.fill, episode_length=256)
    compared = check_same_work(data, base)
    plain = PlainGymEnv(data, base, seed=0)
    plain_calibration = plain_steps_per_second(plain, 2_000)
    plain_rate = plain_steps_per_second(plain, max(2_000, int(plain_calibration * args.seconds)))

    print(
        f"device={args.device} torch_threads={torch.get_num_threads()} bars={data.n_rows} features={args.features} "
        f"window={args.window} fill={args.fill} torch={torch.__version__}"
    )
    print(f"equal work (checked before timing): {compared:,} transitions of TradingEnv and PlainGymEnv agree")
    header = ("N", "TradingEnv", "PlainGymEnv loop", "ratio", "SyncVectorEnv", "ratio")
    print(
        f"{header[0]:>6} | {header[1]:>12} | {header[2]:>16} | {header[3]:>7} | {header[4]:>13} | {header[5]:>7}"
    )
    print("-" * 76)
    for n_envs in args.n_envs:
        env = TradingEnv(data, EnvConfig(**{**base.__dict__, "n_envs": n_envs}), seed=0)
        calibration = tensor_steps_per_second(env, 50)
        rate = tensor_steps_per_second(env, max(50, int(calibration * args.seconds / n_envs)))
        sync_vector = gymnasium.vector.SyncVectorEnv(
            [lambda: PlainGymEnv(data, base)] * n_envs,
            autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP,
        )
        sync_rate = sync_vector_steps_per_second(sync_vector, args.seconds)
        print(
            f"{n_envs:>6} | {rate:>12,.0f} | {plain_rate:>16,.0f} | {rate / plain_rate:>6.1f}× | "
            f"{sync_rate:>13,.0f} | {rate / sync_rate:>6.1f}×"
        )


if __name__ == "__main__":
    main()
