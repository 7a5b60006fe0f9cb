"""Rule baselines that need no network: target-position series to feed `evaluate_positions` (torch only)."""

from __future__ import annotations

import torch

from marketrl.env.config import N_ACTIONS, EnvConfigError
from marketrl.env.market_data import MarketData


def rule_positions(data: MarketData, rule: str, *, seed: int = 0, lookback: int = 20) -> torch.Tensor:
    """Target positions [T] for rule baselines: 'long' (buy and hold), 'short', 'flat', 'random' (uniform over
    {−1, 0, 1}, seeded), 'momentum' (sign of close_t / close_{t−lookback} − 1 within the segment; flat until
    `lookback` bars of the segment exist). Feed the result to `evaluate_positions`."""
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
