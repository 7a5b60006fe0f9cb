"""The vectorized trading env: N environments stepped in one batched tensor operation on the data's device.

No Python loop over environments and no host round-trip inside `TradingEnv.step`. Needs only torch and numpy.
The semantics (observation, reward, fills, costs, episodes and segments) are documented in docs/ENV.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from marketrl.env.config import ACTION_POSITIONS, EnvConfig, EnvConfigError, EnvDataError
from marketrl.env.market_data import MarketData

_START_POOL_STEPS = 64


def step_rewards(
    params: torch.Tensor, previous: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(gross, cost) for positions previous → target (in {−1, 0, 1}); `params` [5, N] are rows of
    `step_parameters` already multiplied by contracts.

    gross = previous × gap return + target × holding return;
    cost = |target − previous| × cost fraction + |previous| × roll close cost + |target| × roll open cost
    (the roll terms are zero except at a roll, where the trade term is: the old contract is closed, the new
    one opened). The single definition shared by `TradingEnv.step` and evaluation (bench's `PlainGymEnv`
    mirrors it in numpy).
    """
    gross = torch.addcmul(target * params[1], previous, params[0])
    cost = (target - previous).abs_().mul_(params[2])
    cost.addcmul_(previous.abs(), params[3]).addcmul_(target.abs(), params[4])
    return gross, cost


def check_segmentation(data: MarketData, config: EnvConfig) -> None:
    """The data must have been segmented with the config's `max_gap`: segments decide episodes and windows."""
    if config.max_gap != data.max_gap:
        raise EnvConfigError(
            f"env.max_gap: the MarketData was segmented with max_gap={data.max_gap}, config says {config.max_gap}"
        )


class TradingEnv:
    """N trading environments on one device, stepped in one batched tensor operation.

    `reset() -> obs [N, W·F + 1]`; `step(actions) -> (obs, reward, terminated, truncated)`, all device tensors.
    ``seed`` may be a sequence of S seeds (S independent trainings batched in one env): then N = S × ``n_envs``, in
    S consecutive blocks of ``config.n_envs`` envs, and block i draws its episode starts from its own generator
    seeded with ``seed[i]``, exactly the starts a single env seeded with ``seed[i]`` draws.
    ``block_rows`` (one [start, stop) per block; folds on the batch axis, `stack_market_data`): block i starts its
    episodes only in its rows, so it draws exactly what a single env over that part alone draws (rows offset).
    Episodes last exactly `episode_length` decisions, then auto-reset: the obs returned for a finished env is the
    first obs of its next episode, and `final_obs` holds the obs each env would have seen next in its old episode
    (use it to bootstrap on `truncated`). `terminated` is always False: episodes end only by the time limit.
    """

    def __init__(
        self,
        data: MarketData,
        config: EnvConfig,
        seed: int | Sequence[int] = 0,
        device: torch.device | str | None = None,
        block_rows: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        check_segmentation(data, config)
        if device is not None and torch.device(device) != data.device:
            data = data.to(device)
        self.data = data
        self.config = config
        self.device = data.device
        seeds = [int(seed)] if isinstance(seed, int | np.integer) else [int(s) for s in seed]
        if not seeds:
            raise EnvConfigError("seed: expected a seed or a non-empty sequence of seeds")
        self.n_blocks = len(seeds)
        self.n_envs = config.n_envs * self.n_blocks
        self.window = config.window
        self.obs_dim = config.window * data.n_features + 1
        starts = data.episode_starts(config.episode_length)
        if starts.size == 0:
            raise EnvDataError(
                f"env.episode_length: no segment (with the segments it rolls into) has more than "
                f"{config.episode_length} bars; shorten episodes or raise env.max_gap "
                f"(longest: {int((data.chain_last - data.chain_first).max()) + 1} bars)"
            )
        self.start_rows = torch.as_tensor(starts, device=self.device)
        self.block_rows = self._check_block_rows(block_rows, data.n_rows)
        # each block's own start rows (None: every block starts anywhere, one gather for all)
        self._block_starts: list[torch.Tensor] | None = None
        if block_rows is not None:
            self._block_starts = []
            for index, (first, stop) in enumerate(self.block_rows):
                mine = starts[(starts >= first) & (starts < stop)]
                if mine.size == 0:
                    raise EnvDataError(
                        f"env.episode_length: block {index} (rows {first}..{stop - 1}) has no segment with "
                        f"more than {config.episode_length} bars"
                    )
                self._block_starts.append(torch.as_tensor(mine, device=self.device))
        self._valid_start = np.zeros(data.n_rows, dtype=bool)
        self._valid_start[starts] = True
        self._params = data.step_parameters(config.fill) * config.contracts
        self._action_positions = torch.tensor(ACTION_POSITIONS, dtype=torch.float32, device=self.device)
        self._generators = [torch.Generator(device=self.device) for _ in seeds]
        self.seed(seeds)
        n = self.n_envs
        self.row = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.position = torch.zeros(n, dtype=torch.float32, device=self.device)
        self.elapsed = torch.zeros(n, dtype=torch.int64, device=self.device)
        self._final_state: tuple[torch.Tensor, torch.Tensor] | None = None
        self.last_cost: torch.Tensor | None = None
        self.last_params: torch.Tensor | None = None  # [5, N] step parameters of the last step's rows

    def _check_block_rows(
        self, block_rows: Sequence[tuple[int, int]] | None, n_rows: int
    ) -> list[tuple[int, int]]:
        if block_rows is None:
            return [(0, n_rows)] * self.n_blocks
        rows = [(int(first), int(stop)) for first, stop in block_rows]
        if len(rows) != self.n_blocks or any(not 0 <= a < b <= n_rows for a, b in rows):
            raise EnvConfigError(
                f"block_rows: expected {self.n_blocks} row ranges [start, stop) within 0..{n_rows}, got {rows}"
            )
        return rows

    def seed(self, seed: int | Sequence[int]) -> None:
        """Re-seed the device generator(s) that draw episode starts, one seed per block (drops starts drawn in
        advance)."""
        seeds = [int(seed)] if isinstance(seed, int | np.integer) else [int(s) for s in seed]
        if len(seeds) != self.n_blocks:
            raise EnvConfigError(f"seed: expected {self.n_blocks} seeds (one per block), got {len(seeds)}")
        for generator, value in zip(self._generators, seeds, strict=True):
            generator.manual_seed(value)
        self._start_pool = torch.zeros(0, self.n_envs, dtype=torch.int64, device=self.device)
        self._pool_cursor = 0

    def state_dict(self) -> dict[str, Any]:
        """Everything later steps depend on besides the data: rows, positions, clocks and the start RNG."""
        return {
            "generators": [generator.get_state() for generator in self._generators],
            "start_pool": self._start_pool,
            "pool_cursor": self._pool_cursor,
            "row": self.row,
            "position": self.position,
            "elapsed": self.elapsed,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly where `state_dict` was taken (for resumable training)."""
        states = state["generators"] if "generators" in state else [state["generator"]]
        for generator, saved in zip(self._generators, states, strict=True):
            generator.set_state(saved)
        self._start_pool = state["start_pool"].to(self.device)
        self._pool_cursor = int(state["pool_cursor"])
        self.row = state["row"].to(self.device)
        self.position = state["position"].to(self.device)
        self.elapsed = state["elapsed"].to(self.device)
        self._final_state = None

    def _draw_starts(self) -> torch.Tensor:
        # Starts are drawn for _START_POOL_STEPS steps at once: one random draw per block and one gather per pool,
        # not per step. Each block draws what a single env of config.n_envs envs with its seed would.
        if self._pool_cursor == self._start_pool.shape[0]:
            block = self.config.n_envs
            pools = self._block_starts or [self.start_rows] * self.n_blocks
            picks = [
                torch.randint(
                    0, pool.shape[0], (_START_POOL_STEPS * block,), generator=generator, device=self.device
                ).view(_START_POOL_STEPS, block)
                for pool, generator in zip(pools, self._generators, strict=True)
            ]
            if self._block_starts is None:
                pick = picks[0] if len(picks) == 1 else torch.cat(picks, dim=1)
                self._start_pool = self.start_rows.index_select(0, pick.reshape(-1)).view(pick.shape)
            else:  # each block's picks index its own start rows
                self._start_pool = torch.cat(
                    [pool[pick] for pool, pick in zip(pools, picks, strict=True)], dim=1
                )
            self._pool_cursor = 0
        self._pool_cursor += 1
        return self._start_pool[self._pool_cursor - 1]

    def reset(self, start_rows: torch.Tensor | np.ndarray | Sequence[int] | None = None) -> torch.Tensor:
        """Start every env flat at a random valid row (or at `start_rows`, checked); returns obs [N, obs_dim]."""
        if start_rows is None:
            rows = self._draw_starts()
        else:
            host_rows = np.asarray(torch.as_tensor(start_rows).cpu(), dtype=np.int64).reshape(-1)
            if host_rows.shape != (self.n_envs,):
                raise EnvDataError(f"start_rows: expected {self.n_envs} rows, got {host_rows.shape[0]}")
            inside = (host_rows >= 0) & (host_rows < self.data.n_rows)
            if not inside.all() or not self._valid_start[host_rows].all():
                raise EnvDataError(
                    "start_rows: every row must be a valid episode start (see MarketData.episode_starts)"
                )
            rows = torch.as_tensor(host_rows, device=self.device)
        self.row = rows
        self.position = torch.zeros(self.n_envs, dtype=torch.float32, device=self.device)
        self.elapsed = torch.zeros(self.n_envs, dtype=torch.int64, device=self.device)
        self._final_state = None
        return self.data.observe(self.row, self.position, self.window)

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Apply actions (LongTensor [N] in {0, 1, 2} = short/flat/long) to every env at once, without host syncs."""
        target = self._action_positions.index_select(0, actions)
        params = self._params.index_select(1, self.row)
        gross, cost = step_rewards(params, self.position, target)
        self.last_cost, self.last_params = cost, params

        next_row = self.row + 1
        elapsed = self.elapsed + 1
        truncated = elapsed >= self.config.episode_length
        self._final_state = (next_row, target)
        self.row = torch.where(truncated, self._draw_starts(), next_row)
        self.position = torch.where(truncated, 0.0, target)
        self.elapsed = torch.where(truncated, 0, elapsed)
        obs = self.data.observe(self.row, self.position, self.window)
        return obs, gross - cost, torch.zeros_like(truncated), truncated

    @property
    def final_obs(self) -> torch.Tensor | None:
        """Obs at t+1 of the last step's old episode, for every env (equal to the returned obs where not done).

        Computed on access (one gather), so callers that do not bootstrap on truncation pay nothing.
        """
        if self._final_state is None:
            return None
        rows, positions = self._final_state
        return self.data.observe(rows, positions, self.window)
