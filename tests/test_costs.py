"""CostModel and per-instrument specs: the cost fraction formulas, scaling, symbol roots and config errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from marketrl.data.definitions import demo_run_config
from marketrl.data.demo import generate_demo_files
from marketrl.env import MarketData
from marketrl.env.config import EnvDataError
from marketrl.instruments.costs import (
    CostConfigError,
    CostModel,
    InstrumentCosts,
    costs_from_config,
    costs_from_record,
    symbol_root,
)
from marketrl.settings.config import validate_config

ES = {
    "kind": "futures",
    "commission_per_contract": 2.0,
    "half_spread_ticks": 0.5,
    "tick_size": 0.25,
    "tick_value": 12.5,
}


def test_futures_cost_fraction_by_hand() -> None:
    model = CostModel.from_config(ES)
    # 2.00 commission + 0.5 tick × 12.50 = 8.25 per contract per side; one ES contract at 4000 = 4000 × 50.
    assert model.cost_fraction(4000.0) == pytest.approx(8.25 / 200_000.0, rel=1e-12)
    prices = np.array([4000.0, 5000.0])
    np.testing.assert_allclose(model.cost_fraction(prices), [8.25 / 200_000.0, 8.25 / 250_000.0], rtol=1e-12)
    as_tensor = model.cost_fraction(torch.tensor([4000.0], dtype=torch.float64))
    assert as_tensor.item() == pytest.approx(8.25 / 200_000.0, rel=1e-12)


def test_bps_cost_fraction_is_constant() -> None:
    model = CostModel.from_config({"kind": "bps", "bps": 1.5})
    assert model.cost_fraction(123.0) == pytest.approx(1.5e-4)
    np.testing.assert_allclose(model.cost_fraction(np.array([1.0, 1e6])), [1.5e-4, 1.5e-4])
    assert torch.allclose(model.cost_fraction(torch.ones(3)), torch.full((3,), 1.5e-4))


@pytest.mark.parametrize("multiplier", [0.0, 0.5, 1.0, 2.0])
def test_scaled_multiplies_every_component(multiplier: float) -> None:
    futures = CostModel.from_config(ES)
    assert futures.scaled(multiplier).cost_fraction(4000.0) == pytest.approx(
        multiplier * futures.cost_fraction(4000.0), rel=1e-12, abs=0.0
    )
    bps = CostModel(kind="bps", bps=2.0)
    assert bps.scaled(multiplier).cost_fraction(1.0) == pytest.approx(multiplier * 2e-4, abs=1e-15)


def test_config_round_trip() -> None:
    assert CostModel.from_config(CostModel.from_config(ES).to_config()) == CostModel.from_config(ES)
    assert CostModel.from_config({"kind": "bps", "bps": 3}).to_config() == {"kind": "bps", "bps": 3.0}


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"bps": 1.0}, "costs.kind"),
        ({"kind": "stocks"}, "costs.kind"),
        ({"kind": "bps"}, "costs.bps"),
        ({"kind": "bps", "bps": -1.0}, "costs.bps"),
        ({"kind": "bps", "bps": "1"}, "costs.bps"),
        ({"kind": "bps", "bps": 1.0, "tick_size": 0.25}, "costs.tick_size"),
        ({**ES, "tick_size": 0.0}, "costs.tick_size"),
        ({k: v for k, v in ES.items() if k != "tick_value"}, "costs.tick_value"),
        ({**ES, "half_spread_ticks": float("nan")}, "costs.half_spread_ticks"),
        ({**ES, "bps": 1.0}, "costs.bps"),
        ({**ES, "slippage": 1.0}, "costs.slippage"),
    ],
)
def test_bad_config_names_the_key(config: dict, key: str) -> None:
    with pytest.raises(CostConfigError, match=key.replace(".", r"\.")) as error:
        CostModel.from_config(config)
    assert isinstance(error.value, ValueError)
    assert "\n" not in str(error.value)


# ------------------------------------------------------------------------------- per-instrument contract specs

# The generic keys of a costs section (no contract spec), and the flat tick pair written as a catch-all.
GENERIC = {"model": "futures", "commission_per_contract": 1.0, "half_spread_ticks": 0.5, "bps": 1.0}
FLAT = {**GENERIC, "tick_size": 0.25, "tick_value": 12.5}
ES_NQ = {
    **GENERIC,
    "instruments": {
        "ES": {"tick_size": 0.25, "tick_value": 12.5},
        "NQ": {"tick_size": 0.25, "tick_value": 5.0},
    },
}


@pytest.mark.parametrize(
    ("symbol", "root"),
    [
        ("ESH4", "ES"),
        ("NQZ24", "NQ"),
        ("MNQZ4", "MNQ"),
        ("6EM5", "6E"),
        ("ZNH4", "ZN"),
        ("ES.c.0", "ES"),
        ("NQ.v.1", "NQ"),
        ("ES.FUT", "ES"),
        ("AAPL", "AAPL"),
        ("17", "17"),
    ],
)
def test_symbol_root(symbol: str, root: str) -> None:
    assert symbol_root(symbol) == root


def test_es_and_nq_costs_by_hand() -> None:
    costs = costs_from_config(ES_NQ)
    assert isinstance(costs, InstrumentCosts)
    # One side: commission + half_spread_ticks * tick_value; as a fraction of price * (tick_value / tick_size).
    es_side, nq_side = 1.0 + 0.5 * 12.5, 1.0 + 0.5 * 5.0
    assert costs.for_symbol("ESH4").cost_fraction(5000.0) == pytest.approx(
        es_side / (5000.0 * 50.0), rel=1e-12
    )
    assert costs.for_symbol("NQ.c.0").cost_fraction(18000.0) == pytest.approx(
        nq_side / (18000.0 * 20.0), rel=1e-12
    )
    # The env prices every row with its own contract's spec.
    data = MarketData.from_arrays(
        np.zeros((4, 1), dtype=np.float32),
        opens=np.array([5000.0, 5000.0, 18000.0, 18000.0]),
        closes=np.array([5000.0, 5004.0, 18000.0, 18010.0]),
        instrument_id=np.array([1, 1, 2, 2]),
        ts_event_ns=np.array([0, 60, 0, 60]) * 10**9,
        symbols=np.array(["ESH4", "ESH4", "NQH4", "NQH4"]),
        cost_model=costs,
    )
    expected = [es_side / (5000 * 50), es_side / (5004 * 50), nq_side / (18000 * 20), nq_side / (18010 * 20)]
    np.testing.assert_allclose(data.cost_close.numpy(), expected, rtol=1e-6)


def test_multiplier_is_tick_value_over_tick_size_and_flat_keys_are_the_defaults() -> None:
    by_multiplier = costs_from_config(
        {**GENERIC, "half_spread_ticks": 1.0, "instruments": {"ES": {"tick_size": 0.25, "multiplier": 50}}}
    )
    es = by_multiplier.for_symbol("ESZ4")
    assert (es.tick_value, es.half_spread_ticks, es.commission_per_contract) == (12.5, 1.0, 1.0)
    own = costs_from_config(
        {**GENERIC, "instruments": {"ES": {"tick_size": 0.25, "tick_value": 12.5, "half_spread_ticks": 2}}}
    )
    assert own.for_symbol("ES.c.0").half_spread_ticks == 2.0


def test_the_flat_pair_the_user_wrote_is_the_catch_all_of_every_instrument() -> None:
    """costs.tick_size + costs.tick_value, both written, with costs.instruments {}: one spec for every symbol."""
    flat = costs_from_config({**FLAT, "instruments": {}})
    assert costs_from_config(validate_config({"costs": FLAT})["costs"]) == flat
    assert flat == CostModel.from_config({"kind": "futures", **{k: FLAT[k] for k in ES if k != "kind"}})
    prices = np.array([5000.0, 100.0])
    np.testing.assert_allclose(
        MarketData.from_arrays(
            np.zeros((2, 1), dtype=np.float32),
            opens=prices,
            closes=prices,
            instrument_id=np.array([1, 2]),
            ts_event_ns=np.array([0, 0]),
            cost_model=flat,
        ).cost_close.numpy(),
        7.25 / (prices * 50.0),
        rtol=1e-6,
    )


NO_SPEC = (
    r"^costs\.instruments: no contract spec for costs\.model futures; write a spec per symbol root "
    r"\(e\.g\. costs\.instruments: \{ES: \{tick_size: 0\.25, tick_value: 12\.5\}\}\), set data\.definitions .*, "
    r"or write costs\.tick_size and costs\.tick_value as the catch-all spec of every instrument$"
)


@pytest.mark.parametrize(
    "costs",
    [
        GENERIC,
        {**GENERIC, "instruments": {}},
        {**GENERIC, "tick_size": None, "tick_value": None},
        validate_config({})["costs"],  # the schema's defaults hold no contract
    ],
)
def test_futures_without_any_contract_spec_is_a_one_line_error(costs: dict) -> None:
    """No silent catch-all: CL or ZN data with no costs section must not be priced as ES."""
    with pytest.raises(CostConfigError, match=NO_SPEC) as info:
        costs_from_config(costs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("written", "missing"), [("tick_size", "tick_value"), ("tick_value", "tick_size")])
def test_half_a_flat_pair_is_an_error_naming_the_missing_key(written: str, missing: str) -> None:
    for instruments in ({}, ES_NQ["instruments"]):
        with pytest.raises(CostConfigError, match=rf"^costs\.{missing}: missing beside costs\.{written}; "):
            costs_from_config({**GENERIC, written: FLAT[written], "instruments": instruments})


def test_bps_needs_no_contract_spec() -> None:
    bps = costs_from_config({**GENERIC, "model": "bps", "bps": 2.0})
    assert bps == CostModel(kind="bps", bps=2.0)
    assert costs_from_config(validate_config({"costs": {"model": "bps", "bps": 2.0}})["costs"]) == bps


def test_an_instrument_without_a_spec_is_a_one_line_error_unless_there_is_a_default() -> None:
    costs = costs_from_config(ES_NQ)
    with pytest.raises(
        CostConfigError, match=r"no contract spec for instrument 'CLZ4' \(root 'CL'\).*costs\.instruments\.CL"
    ):
        costs.for_symbol("CLZ4")
    kwargs = {
        "opens": np.array([70.0, 70.5]),
        "closes": np.array([70.0, 70.5]),
        "instrument_id": np.array([3, 3]),
        "ts_event_ns": np.array([0, 60]) * 10**9,
        "symbols": np.array(["CLZ4", "CLZ4"]),
    }
    with pytest.raises(EnvDataError, match="CLZ4"):
        MarketData.from_arrays(np.zeros((2, 1), dtype=np.float32), cost_model=costs, **kwargs)
    with_default = costs_from_config(
        {**ES_NQ, "instruments": {**ES_NQ["instruments"], "default": {"tick_size": 0.01, "tick_value": 10.0}}}
    )
    assert with_default.for_symbol("CLZ4").tick_value == 10.0
    data = MarketData.from_arrays(np.zeros((2, 1), dtype=np.float32), cost_model=with_default, **kwargs)
    assert data.cost_close[0].item() == pytest.approx((1.0 + 0.5 * 10.0) / (70.0 * 1000.0), rel=1e-6)


def test_instrument_specs_round_trip_and_scale() -> None:
    costs = costs_from_config(
        {
            **ES_NQ,
            "instruments": {
                **ES_NQ["instruments"],
                "ES": {"tick_size": 0.25, "tick_value": 12.5, "currency": "USD"},
            },
        }
    )
    assert costs_from_record(costs.to_config()) == costs
    assert costs.for_symbol("ESH4").currency == "USD"
    doubled = costs.scaled(2.0)
    assert doubled.for_symbol("NQH4").cost_fraction(1.0) == pytest.approx(
        2 * costs.for_symbol("NQH4").cost_fraction(1.0)
    )
    bps = costs_from_config({**ES_NQ, "model": "bps", "instruments": {"ES": {"bps": 0.5}, "NQ": {}}})
    assert bps.for_symbol("ESH4").cost_fraction(1.0) == pytest.approx(0.5e-4)
    assert bps.for_symbol("NQH4").cost_fraction(1.0) == pytest.approx(1.0e-4)  # the flat costs.bps


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        ({"tick_value": 12.5}, "costs.instruments.ES.tick_size"),
        ({"tick_size": 0.25}, "costs.instruments.ES.tick_value"),
        ({"tick_size": 0.25, "tick_value": 12.5, "multiplier": 50}, "costs.instruments.ES.tick_value"),
        ({"tick_size": 0.0, "tick_value": 12.5}, "costs.instruments.ES.tick_size"),
        ({"tick_size": 0.25, "tick_value": 12.5, "tick": 1}, "costs.instruments.ES.tick"),
        ({"tick_size": 0.25, "tick_value": 12.5, "currency": 3}, "costs.instruments.ES.currency"),
        ("0.25", "costs.instruments.ES"),
    ],
)
def test_bad_instrument_spec_names_the_key(spec: object, key: str) -> None:
    with pytest.raises(CostConfigError, match=key.replace(".", r"\.")) as info:
        costs_from_config({**GENERIC, "instruments": {"ES": spec}})
    assert "\n" not in str(info.value)


def test_runs_outside_the_pipeline_cost_demo_nq_as_nq(tmp_path: Path) -> None:
    """bench/ scripts build their config with demo_run_config: the demo's definition file, not the flat ES keys."""
    generate_demo_files(tmp_path / "raw", "2024-03-07", 1, seed=3)
    config = demo_run_config(tmp_path / "raw", {"seed": 5})
    assert config["seed"] == 5 and config["data"]["definitions"].endswith("definitions/*")
    costs = costs_from_config(config["costs"])
    es, nq = costs.for_symbol("ES.c.0"), costs.for_symbol("NQ.c.0")
    assert (es.tick_value, nq.tick_value, es.tick_size, nq.tick_size) == (12.5, 5.0, 0.25, 0.25)
    assert nq.cost_fraction(18000.0) == pytest.approx((1.0 + 0.5 * 5.0) / (18000.0 * 20.0), rel=1e-12)
