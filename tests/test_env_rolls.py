"""Continuous contracts: at a roll (instrument_id changes under one continuous symbol) no return spans the two
contracts, whatever the price gap between them, and each contract is priced with its own spec."""

from __future__ import annotations

import numpy as np
import pytest

from marketrl.costs import costs_from_config
from marketrl.env import MarketData

MINUTE_NS = 60_000_000_000


def _roll_data() -> MarketData:
    # ES.c.0 across a roll: ESH4 (id 11) trades at ~5000, ESM4 (id 12) at ~5060, one minute after ESH4's last bar.
    old = np.array([5000.0, 5001.0, 5002.0, 5003.0])
    new = np.array([5060.0, 5061.0, 5059.0])
    closes = np.concatenate([old, new])
    ts = np.concatenate([np.arange(4), np.arange(4, 7)]) * MINUTE_NS
    costs = costs_from_config(
        {
            "model": "futures",
            "commission_per_contract": 1.0,
            "half_spread_ticks": 0.5,
            "instruments": {"ES": {"tick_size": 0.25, "tick_value": 12.5}},
        }
    )
    return MarketData.from_arrays(
        np.zeros((7, 2), dtype=np.float32),
        opens=closes,
        closes=closes,
        instrument_id=np.array([11] * 4 + [12] * 3),
        ts_event_ns=ts,
        symbols=np.array(["ESH4"] * 4 + ["ESM4"] * 3),
        cost_model=costs,
    )


def test_no_return_spans_a_roll() -> None:
    data = _roll_data()
    assert data.segment_id.tolist() == [0, 0, 0, 0, 1, 1, 1]
    last_old = 3
    assert not bool(data.is_decision[last_old])  # the old contract's last bar is never a decision bar
    for name in ("ret_close_close", "ret_close_open", "ret_open_close", "cost_next_open"):
        assert getattr(data, name)[last_old].item() == 0.0, name
    jumps = data.ret_close_close.numpy()
    assert np.abs(jumps).max() < 0.001  # the 60-point gap between the contracts (1.2 %) is nowhere
    assert data.ret_close_close[4].item() == pytest.approx(5061 / 5060 - 1, rel=1e-6)
    # Both contracts of the root use the ES spec.
    np.testing.assert_allclose(
        data.cost_close.numpy()[[3, 4]], 7.25 / (np.array([5003.0, 5060.0]) * 50), rtol=1e-6
    )


def test_no_episode_crosses_a_roll() -> None:
    data = _roll_data()
    starts = data.episode_starts(2)
    assert starts.tolist() == [0, 1, 4]  # episodes of 2 decisions fit inside one contract only
