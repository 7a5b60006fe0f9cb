"""gymnasium / Stable-Baselines3 adapters over `TradingEnv`, and `PlainGymEnv`, a numpy single-env reference.

Test and benchmark support, not library code: the library's env needs neither gymnasium nor SB3. Imported as
`tests.support.adapters` by the tests and by the bench/speed/ scripts (which put the checkout on sys.path).
`PlainGymEnv` implements the semantics of docs/ENV.md independently, in plain numpy, for one environment: the
reference in tests/test_env_adapters.py and the baseline of bench/speed/env.py.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from marketrl.env import ACTION_POSITIONS, N_ACTIONS, EnvConfig, EnvDataError, MarketData, TradingEnv


def _observation_box(data: MarketData, window: int) -> gymnasium.spaces.Box:
    """Features within ±feature_clip (unbounded without a clip), then the position in [−1, 1]."""
    bound = np.inf if data.feature_clip is None else data.feature_clip
    high = np.append(np.full(window * data.n_features, bound, dtype=np.float32), np.float32(1.0))
    return gymnasium.spaces.Box(low=-high, high=high, dtype=np.float32)


class GymVectorEnv(gymnasium.vector.VectorEnv):
    """gymnasium 1.x vector adapter over `TradingEnv` (numpy in/out), autoreset mode SAME_STEP.

    As in `TradingEnv`, a finished env's returned obs is the first of its next episode; its last obs is in
    `infos["final_obs"]` (object array, None elsewhere) with the mask `infos["_final_obs"]`.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP}  # noqa: RUF012 - gymnasium's API

    def __init__(self, env: TradingEnv) -> None:
        self.env = env
        self.num_envs = env.n_envs
        self.single_observation_space = _observation_box(env.data, env.window)
        self.single_action_space = gymnasium.spaces.Discrete(N_ACTIONS)
        self.observation_space = gymnasium.vector.utils.batch_space(
            self.single_observation_space, self.num_envs
        )
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space, self.num_envs)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset all envs; `options={"start_rows": [...]}` pins the starts."""
        if seed is not None:
            self.env.seed(seed)
        obs = self.env.reset((options or {}).get("start_rows"))
        return obs.cpu().numpy(), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step all envs; actions are N integers in {0, 1, 2}."""
        actions = np.asarray(actions, dtype=np.int64).reshape(-1)
        if actions.shape != (self.num_envs,) or actions.min() < 0 or actions.max() >= N_ACTIONS:
            raise ValueError(
                f"actions: expected {self.num_envs} integers in [0, {N_ACTIONS}), got {actions!r}"
            )
        obs, reward, terminated, truncated = self.env.step(torch.as_tensor(actions, device=self.env.device))
        done = (terminated | truncated).cpu().numpy()
        infos: dict[str, Any] = {}
        if done.any():
            final = np.full(self.num_envs, None, dtype=object)
            final_obs = self.env.final_obs.cpu().numpy()
            for index in np.flatnonzero(done):
                final[index] = final_obs[index]
            infos = {"final_obs": final, "_final_obs": done, "final_info": {}, "_final_info": done}
        return (
            obs.cpu().numpy(),
            reward.cpu().numpy(),
            terminated.cpu().numpy(),
            truncated.cpu().numpy(),
            infos,
        )


def make_sb3_vec_env(env: TradingEnv) -> Any:
    """A Stable-Baselines3 `VecEnv` over `env` (requires the `bench` extra: stable-baselines3).

    SB3 conventions: `dones = terminated | truncated`; a finished env's last obs is in
    `infos[i]["terminal_observation"]` and `infos[i]["TimeLimit.truncated"]` marks time-limit ends.
    """
    from stable_baselines3.common.vec_env import VecEnv

    class SB3VecEnv(VecEnv):
        def __init__(self, inner: TradingEnv) -> None:
            self.inner = inner
            self._actions: torch.Tensor | None = None
            super().__init__(
                inner.n_envs, _observation_box(inner.data, inner.window), gymnasium.spaces.Discrete(N_ACTIONS)
            )

        def reset(self) -> np.ndarray:
            if any(seed is not None for seed in self._seeds):
                self.inner.seed(self._seeds[0])
            self._reset_seeds()
            return self.inner.reset().cpu().numpy()

        def step_async(self, actions: np.ndarray) -> None:
            self._actions = torch.as_tensor(
                np.asarray(actions, dtype=np.int64).reshape(-1), device=self.inner.device
            )

        def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
            obs, reward, terminated, truncated = self.inner.step(self._actions)
            dones = (terminated | truncated).cpu().numpy()
            truncated_host = truncated.cpu().numpy()
            infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
            if dones.any():
                final_obs = self.inner.final_obs.cpu().numpy()
                for index in np.flatnonzero(dones):
                    infos[index] = {
                        "terminal_observation": final_obs[index],
                        "TimeLimit.truncated": bool(truncated_host[index]),
                    }
            return obs.cpu().numpy(), reward.cpu().numpy(), dones, infos

        def close(self) -> None:
            pass

        def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
            value = None if attr_name == "render_mode" else getattr(self.inner, attr_name)
            return [value] * len(self._get_indices(indices))

        def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
            setattr(self.inner, attr_name, value)

        def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
            result = getattr(self.inner, method_name)(*args, **kwargs)
            return [result] * len(self._get_indices(indices))

        def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
            return [False] * len(self._get_indices(indices))

    return SB3VecEnv(env)


class PlainGymEnv(gymnasium.Env):
    """One trading environment in plain numpy with the same semantics as `TradingEnv` (reference and baseline).

    No auto-reset (gymnasium single-env convention): after `truncated`, call `reset()`.
    `reset(options={"start_row": r})` pins the start row.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's API

    def __init__(self, data: MarketData, config: EnvConfig, seed: int | None = None) -> None:
        self.config = config
        self.window = config.window
        self.features, self.params, self.segment_start = data.host_arrays(config.fill)
        self.starts = data.episode_starts(config.episode_length)
        if self.starts.size == 0:
            raise EnvDataError(f"env.episode_length: no segment has more than {config.episode_length} bars")
        self.observation_space = _observation_box(data, config.window)
        self.action_space = gymnasium.spaces.Discrete(N_ACTIONS)
        self._seed = seed
        self.row = 0
        self.position = np.float32(0.0)
        self.elapsed = 0

    def _observe(self, row: int, position: np.float32) -> np.ndarray:
        first = max(row - self.window + 1, int(self.segment_start[row]))
        window = self.features[first : row + 1]
        if window.shape[0] < self.window:  # repeat the segment's first row, as TradingEnv does
            window = np.concatenate([np.repeat(window[:1], self.window - window.shape[0], axis=0), window])
        return np.concatenate([window.reshape(-1), np.array([position], dtype=np.float32)])

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start flat at a random valid row (or `options["start_row"]`)."""
        if seed is None:  # the constructor's seed applies to the first reset
            seed = self._seed
        self._seed = None
        super().reset(seed=seed)
        start = (options or {}).get("start_row")
        self.row = (
            int(self.starts[self.np_random.integers(self.starts.size)]) if start is None else int(start)
        )
        self.position = np.float32(0.0)
        self.elapsed = 0
        return self._observe(self.row, self.position), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Move to target position ACTION_POSITIONS[action]; reward as in `step_rewards`."""
        target = np.float32(ACTION_POSITIONS[int(action)])
        gap_return, hold_return, cost_fraction, roll_close, roll_open = self.params[self.row]
        contracts = np.float32(self.config.contracts)
        gross = target * (hold_return * contracts) + self.position * (gap_return * contracts)
        cost = abs(target - self.position) * (cost_fraction * contracts)
        cost += abs(self.position) * (roll_close * contracts) + abs(target) * (roll_open * contracts)
        self.row += 1
        self.elapsed += 1
        self.position = target
        truncated = self.elapsed >= self.config.episode_length
        return (
            self._observe(self.row, self.position),
            float(gross - cost),
            False,
            truncated,
            {"cost": float(cost)},
        )
