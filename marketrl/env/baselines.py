"""Rule baselines that need no network: target-position series to feed `evaluate_positions` (torch only)."""

from __future__ import annotations

import torch

from marketrl.env.config import N_ACTIONS, EnvConfigError
from marketrl.env.market_data import MarketData


def rule_positions(data: MarketData, rule: str, *, seed: int = 0, lookback: int = 20) -> torch.Tensor:
    """Target positions [T] for rule baselines: 'long' (buy and hold), 'short', 'flat', 'random' (uniform over
    {−1, 0, 1}, seeded), 'momentum' (sign of close_t / close_{t−lookback} − 1 within the segment, one
    contract's prices only; flat until `lookback` bars of the segment exist, also after a roll). Feed the
    result to `evaluate_positions`."""
    n = data.n_rows
    if rule in ("long", "short", "flat"):
        return torch.full((n,), {"long": 1.0, "short": -1.0, "flat": 0.0}[rule], device=data.device)
    if rule == "random":
        generator = torch.Generator(device=data.device).manual_seed(seed)
        draws = torch.randint(0, N_ACTIONS, (n,), generator=generator, device=data.device)
        return draws.to(torch.float32) - 1.0
    if rule == "momentum":
        if lookback < 1:
            raise EnvConfigError(f"momentum lookback: expected an integer >= 1, got {lookback!r}")
        rows = torch.arange(n, device=data.device)
        past = rows - lookback
        known = past >= data.segment_start
        past_close = data.close.index_select(0, past.clamp(min=0))
        signal = torch.sign(data.close / past_close - 1.0).to(torch.float32)
        return torch.where(known, signal, torch.zeros_like(signal))
    raise EnvConfigError(f"baseline rule: expected long, short, flat, random or momentum, got {rule!r}")


def position_change_rate(data: MarketData, positions: torch.Tensor) -> float:
    """Share of decision rows at which `positions` [T] differs from the position held before (flat at the start
    of each chain): how often a strategy trades, whatever the direction (holding through a roll is no change)."""
    positions = torch.as_tensor(positions, device=data.device).to(torch.float32).reshape(-1)
    rows = torch.arange(data.n_rows, device=data.device)
    previous = torch.cat([positions.new_zeros(1), positions[:-1]])
    previous = torch.where(rows == data.chain_start, torch.zeros_like(previous), previous)
    decisions = data.is_decision
    n_decisions = int(decisions.sum())
    return float(((positions != previous) & decisions).sum()) / n_decisions if n_decisions else 0.0


def matched_random_positions(data: MarketData, change_rate: float, *, seed: int) -> torch.Tensor:
    """Target positions [T] of a random trader that trades as often as a given strategy and no more cleverly:
    at each decision row it changes position with probability `change_rate` (seeded coin), to one of the two
    other positions of {−1, 0, 1} with equal chance; each chain starts flat; non-decision rows are 0.

    It sees only the rate, never the strategy's positions, so its direction cannot depend on them."""
    if not 0.0 <= change_rate <= 1.0:
        raise EnvConfigError(f"matched random trader: change rate must be in [0, 1], got {change_rate!r}")
    n = data.n_rows
    generator = torch.Generator(device=data.device).manual_seed(seed)
    changes = torch.rand(n, generator=generator, device=data.device) < change_rate
    steps = torch.randint(1, N_ACTIONS, (n,), generator=generator, device=data.device)  # +1 or +2 (mod 3)
    increments = torch.where(changes & data.is_decision, steps, torch.zeros_like(steps))
    total = increments.cumsum(0)
    before_chain = torch.where(
        data.chain_start > 0, total.index_select(0, (data.chain_start - 1).clamp(min=0)), 0
    )
    flat = 1  # index of position 0 in ACTION_POSITIONS
    state = (flat + total - before_chain) % N_ACTIONS
    positions = state.to(torch.float32) - 1.0
    return torch.where(data.is_decision, positions, torch.zeros_like(positions))
