"""CostModel: the cost fraction formulas, scaling and config errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marketrl.costs import CostConfigError, CostModel

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
