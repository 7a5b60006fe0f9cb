"""Deterministic evaluation: a policy (or a precomputed position series) over every decision bar of a split.

`policy_positions`, `position_results` and `decision_results` are tensors in, tensors out (torch and numpy only;
the last two score K traders at once from [K, T] positions); `evaluate`, `evaluate_positions` and
`results_frame` label one trader's results per bar as a polars DataFrame (polars is imported on first use).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from marketrl.env.config import ACTION_POSITIONS, EnvConfig, EnvDataError
from marketrl.env.market_data import MarketData
from marketrl.env.tensor_env import check_segmentation, step_rewards

if TYPE_CHECKING:
    import polars as pl

Policy = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PositionResults:
    """Per-row device tensors [T] of holding target positions; only rows where `data.is_decision` count.

    position: after the decision at the close of row t, in contracts; gross_return, cost: the `TradingEnv.step`
    reward terms of that decision (fractions of one contract's notional), earned over bar t+1.
    """

    position: torch.Tensor
    gross_return: torch.Tensor
    cost: torch.Tensor

    @property
    def net_return(self) -> torch.Tensor:
        """gross_return − cost."""
        return self.gross_return - self.cost


def position_results(
    data: MarketData, positions: torch.Tensor | np.ndarray, config: EnvConfig | None = None
) -> PositionResults:
    """Rewards of holding `positions[..., t]` (target in {−1, 0, 1}, decided at the close of row t), as tensors.

    `positions` is [T] for one trader or [K, T] for K traders scored at once (same fills and costs, one batched
    `step_rewards`); the results have its shape. Each chain starts flat and a position carries through a roll
    (closed on the old contract, reopened on the new one); non-decision rows (the last bar of each chain) earn
    nothing. `positions[..., t]` must use only information known at the close of bar t.
    """
    config = config or EnvConfig(max_gap=data.max_gap)
    check_segmentation(data, config)
    target = torch.as_tensor(positions, device=data.device).to(torch.float32)
    if target.ndim == 0 or target.ndim > 2 or target.shape[-1] != data.n_rows:
        raise EnvDataError(
            f"positions: expected {data.n_rows} values (one per row), or [K, {data.n_rows}] for K traders; "
            f"got shape {tuple(target.shape)}"
        )
    if not bool(torch.isin(target, torch.tensor(ACTION_POSITIONS, device=target.device)).all()):
        raise EnvDataError("positions: expected target positions in {-1, 0, 1} (units of env.contracts)")
    rows = torch.arange(data.n_rows, device=data.device)
    previous = torch.cat([target.new_zeros(*target.shape[:-1], 1), target[..., :-1]], dim=-1)
    previous = torch.where(rows == data.chain_start, torch.zeros_like(previous), previous)
    gross, cost = step_rewards(data.step_parameters(config.fill) * config.contracts, previous, target)
    return PositionResults(position=target * config.contracts, gross_return=gross, cost=cost)


def decision_results(
    data: MarketData, positions: torch.Tensor | np.ndarray, config: EnvConfig | None = None
) -> PositionResults:
    """`position_results` on the decision rows only (`data.is_decision`): tensors [..., D], one column per
    decision bar in row order, the columns of `evaluate_positions`."""
    results = position_results(data, positions, config)
    decision_rows = torch.nonzero(data.is_decision).reshape(-1)
    return PositionResults(
        position=results.position.index_select(-1, decision_rows),
        gross_return=results.gross_return.index_select(-1, decision_rows),
        cost=results.cost.index_select(-1, decision_rows),
    )


def policy_positions(policy: Policy, data: MarketData, config: EnvConfig | None = None) -> torch.Tensor:
    """Target positions [T] the greedy `policy` chooses, all segments stepped in lockstep as one batch.

    `policy(obs [K, W·F + 1]) -> actions LongTensor [K]` (K = number of chains; obs as in `TradingEnv`);
    every chain starts flat, the position it holds carries through its rolls; non-decision rows get 0.
    """
    one = policies_positions(lambda obs: policy(obs[0])[None], 1, data, config)
    return one[0]


def policies_positions(
    policies: Callable[[torch.Tensor], torch.Tensor],
    n_policies: int,
    data: MarketData,
    config: EnvConfig | None = None,
) -> torch.Tensor:
    """`policy_positions` of S policies at once, [S, T]: ``policies(obs [S, K, W·F + 1]) -> actions [S, K]``
    (e.g. the S seeds of a batch as one stacked network), so a lockstep step is one forward for all of them.
    Policy s sees only its own positions: its rows of the batch are its own."""
    config = config or EnvConfig(max_gap=data.max_gap)
    check_segmentation(data, config)
    chains = np.flatnonzero(data.chain_last > data.chain_first)  # chains with at least one decision
    # + a scratch slot per policy
    positions = torch.zeros(n_policies, data.n_rows + 1, dtype=torch.float32, device=data.device)
    if chains.size:
        with torch.no_grad():
            _run_policies(policies, n_policies, data, config.window, chains, positions)
    return positions[:, :-1]


def _run_policies(
    policies: Callable[[torch.Tensor], torch.Tensor],
    n_policies: int,
    data: MarketData,
    window: int,
    chains: np.ndarray,
    positions: torch.Tensor,
) -> None:
    """Step the policies through `chains` in lockstep (one batch row per policy and chain), writing each decision
    into `positions[s, row]`; chains that have finished keep stepping on their last row and write to the scratch
    slot."""
    first = torch.as_tensor(data.chain_first[chains], device=data.device)
    last_decision = torch.as_tensor(data.chain_last[chains] - 1, device=data.device)
    scratch_row = torch.full_like(first, data.n_rows)
    action_positions = torch.tensor(ACTION_POSITIONS, dtype=torch.float32, device=data.device)
    held = torch.zeros(n_policies, chains.size, dtype=torch.float32, device=data.device)
    n_steps = int((data.chain_last[chains] - data.chain_first[chains]).max())
    for step in range(n_steps):
        row = torch.minimum(first + step, last_decision)
        active = first + step <= last_decision
        obs = data.observe(row.repeat(n_policies), held.reshape(-1), window)
        actions = policies(obs.view(n_policies, chains.size, -1)).reshape(-1)
        target = action_positions.index_select(0, actions).view(n_policies, chains.size)
        held = torch.where(active, target, held)
        positions.index_copy_(1, torch.where(active, row, scratch_row), target)


#: decision rows per batched forward of `tabulated_policies_positions` (x3 held positions x S policies)
TABLE_CHUNK = 4096


def tabulated_policies_positions(
    policies: Callable[[torch.Tensor], torch.Tensor],
    n_policies: int,
    data: MarketData,
    config: EnvConfig | None = None,
    chunk: int = TABLE_CHUNK,
) -> torch.Tensor:
    """`policies_positions` without a forward per bar, for policies whose action depends on the observation
    alone (greedy, stateless: every agent's evaluation policy).

    An observation is the feature window of row t plus the position held into t, one of ACTION_POSITIONS; so
    each policy's action at every decision row for each position it could hold is one table [S, 3, D], filled
    by batched forwards of `chunk` rows, and the positions follow by walking each chain through that table on
    the host. The observations are the lockstep pass's, bit for bit; the actions match it wherever the
    policies' scores do not depend on how many rows share a forward (row-wise MLPs on the CPU in fp32:
    tests/test_env_eval.py checks both paths agree). Evaluation only: training keeps the lockstep pass.
    """
    config = config or EnvConfig(max_gap=data.max_gap)
    check_segmentation(data, config)
    chains = np.flatnonzero(data.chain_last > data.chain_first)  # chains with at least one decision
    positions = np.zeros((n_policies, data.n_rows), dtype=np.float32)
    if chains.size:
        firsts, stops = data.chain_first[chains], data.chain_last[chains]  # decision rows: [first, stop)
        rows = np.concatenate([np.arange(a, b) for a, b in zip(firsts, stops, strict=True)])
        table = _action_table(policies, n_policies, data, config.window, rows, chunk)
        flat = ACTION_POSITIONS.index(0.0)  # every chain starts flat
        values = np.asarray(ACTION_POSITIONS, dtype=np.float32)
        offsets = np.r_[0, np.cumsum(stops - firsts)]
        for s in range(n_policies):
            # per decision row, the action for each held position: (action if held -1, if 0, if +1)
            by_held = list(zip(*table[s].tolist(), strict=True))
            chosen = []
            for lo, hi in itertools.pairwise(offsets.tolist()):
                held = flat
                for i in range(lo, hi):
                    held = by_held[i][held]
                    chosen.append(held)
            positions[s, rows] = values[chosen]
    return torch.as_tensor(positions, device=data.device)


def _action_table(
    policies: Callable[[torch.Tensor], torch.Tensor],
    n_policies: int,
    data: MarketData,
    window: int,
    rows: np.ndarray,
    chunk: int,
) -> np.ndarray:
    """Actions [S, 3, len(rows)] (indices into ACTION_POSITIONS) of each policy at `rows` for each held position."""
    held_values = torch.tensor(ACTION_POSITIONS, dtype=torch.float32, device=data.device)
    n_held = held_values.numel()
    table = np.empty((n_policies, n_held, rows.size), dtype=np.int64)
    with torch.no_grad():
        for start in range(0, rows.size, chunk):
            part = torch.as_tensor(rows[start : start + chunk], device=data.device)
            obs = data.observe(part.repeat(n_held), held_values.repeat_interleave(part.numel()), window)
            actions = policies(obs.expand(n_policies, *obs.shape))  # every policy sees the same rows
            table[:, :, start : start + part.numel()] = actions.view(n_policies, n_held, -1).cpu().numpy()
    return table


def fill_columns(
    data: MarketData, positions: torch.Tensor | np.ndarray, config: EnvConfig | None = None
) -> dict[str, np.ndarray]:
    """What one trader's fills ([T] target positions) paid, per decision row [D] (host arrays):
    ``traded`` contracts (|Δposition|; at a roll the old contract closed plus the new one opened),
    ``half_spread_ticks`` of the fill (the quote's, or the configured one where it fell back; at a roll the
    legs' average weighted by contracts; NaN under a bps model) and ``quote_fallback`` (1: a trade whose quote
    was missing, zero or crossed, so the configured half-spread was paid; else 0; NaN (null in the per-bar
    frame) where the data had no quotes)."""
    config = config or EnvConfig(max_gap=data.max_gap)
    target = torch.as_tensor(positions).detach().to("cpu", torch.float64).numpy().reshape(-1)
    previous = np.concatenate([[0.0], target[:-1]])
    previous[data.chain_start.cpu().numpy() == np.arange(data.n_rows)] = 0.0
    if config.fill == "close":
        ticks, fallback = data.half_spread_ticks_close, data.fallback_close
    else:  # the quote at the next bar's open
        ticks = np.append(data.half_spread_ticks_open[1:], np.nan)
        fallback = np.append(data.fallback_open[1:], False)
    roll = data.is_roll.cpu().numpy()
    old, new = np.abs(previous), np.abs(target)
    open_ticks = np.append(data.half_spread_ticks_open[1:], np.nan)
    open_fallback = np.append(data.fallback_open[1:], False)
    legs = old + new
    with np.errstate(invalid="ignore", divide="ignore"):
        roll_ticks = np.where(
            legs > 0,
            (old * data.half_spread_ticks_close + new * open_ticks) / legs,
            data.half_spread_ticks_close,
        )
    traded = np.where(roll, legs, np.abs(target - previous))
    rows = np.flatnonzero(data.is_decision.cpu().numpy())
    return {
        "traded": (traded * config.contracts)[rows].astype(np.float32),
        "half_spread_ticks": np.where(roll, roll_ticks, ticks)[rows].astype(np.float32),
        "quote_fallback": (
            np.where(
                roll, (old > 0) & data.fallback_close | (new > 0) & open_fallback, (traded > 0) & fallback
            )[rows].astype(np.float32)
            if data.quoted
            else np.full(rows.size, np.nan, dtype=np.float32)  # no quotes: nothing to fall back from (null)
        ),
    }


def evaluate_positions(
    data: MarketData, positions: torch.Tensor | np.ndarray, config: EnvConfig | None = None
) -> pl.DataFrame:
    """`position_results` of one trader ([T] positions) as one polars row per decision bar t, with its
    `fill_columns` (see `evaluate` for the columns)."""
    return results_frame(
        data, decision_results(data, positions, config), fill_columns(data, positions, config)
    )


def results_frame(
    data: MarketData, results: PositionResults, extra: dict[str, np.ndarray] | None = None
) -> pl.DataFrame:
    """One trader's `decision_results` ([D] tensors) as one polars row per decision bar (see `evaluate`), and
    the `extra` columns ([D] each) after them."""
    if data.rows is None:
        raise EnvDataError(
            "MarketData: built from arrays without row labels; per-bar frames need MarketData.from_frame "
            "(position_results gives the tensors)"
        )
    from marketrl.env import frames  # polars is needed only for the per-bar frame

    decision_rows = np.flatnonzero(data.is_decision.cpu().numpy())
    columns = {
        "segment": data.segment_id.cpu().numpy()[decision_rows],
        "position": results.position.cpu().numpy().round().astype(np.int32),
        "gross_return": results.gross_return.cpu().numpy().astype(np.float64),
        "cost": results.cost.cpu().numpy().astype(np.float64),
    }
    return frames.bar_frame(data.rows, decision_rows, columns, extra)


def evaluate(policy: Policy, data: MarketData, config: EnvConfig | None = None) -> pl.DataFrame:
    """One deterministic pass of `policy` over every decision bar of the split (see `policy_positions`).

    Returns one row per decision bar t, labelled by the bar it earns over (t+1):
      ts_event, trading_day   of bar t+1 (the bar whose return the position earns)
      symbol, instrument_id, decision_ts_event (bar t), segment
      position                after the decision at t, in contracts
      gross_return, cost, net_return   the `TradingEnv.step` reward terms (fractions of one contract's notional)
      traded, half_spread_ticks, quote_fallback   what the decision's fills paid (`fill_columns`)
    """
    return evaluate_positions(data, policy_positions(policy, data, config), config)
