"""`marketrl.loop.hparams.parse_hparams`: pydantic's strict validation of every hyperparameter dataclass, with the
one-line `hparams.<key>` messages (the per-model cases are in tests/test_agents.py and tests/test_models.py)."""

from __future__ import annotations

import dataclasses

import pytest

from marketrl.agents import dqn, ppo
from marketrl.loop.hparams import HParamError, parse_hparams
from marketrl.models import MODELS

CLASSES: dict[str, type] = {
    "dqn": dqn.DQNHyperparams,
    "ppo": ppo.PPOHyperparams,
    **{name: model.hparams_class for name, model in MODELS.items()},
}


@pytest.mark.parametrize("model", sorted(CLASSES))
def test_every_hparams_class_parses_its_defaults_back(model: str) -> None:
    cls = CLASSES[model]
    assert parse_hparams(cls, None, model) == cls()
    assert parse_hparams(cls, dataclasses.asdict(cls()), model) == cls()


def test_an_int_becomes_a_float_where_a_float_is_expected() -> None:
    hp = parse_hparams(dqn.DQNHyperparams, {"learning_rate": 1, "max_grad_norm": 2}, "dqn")
    assert type(hp.learning_rate) is float and type(hp.max_grad_norm) is float
    assert type(hp.batch_size) is int


@pytest.mark.parametrize(
    ("hparams", "message"),
    [
        ({"learning_rate": False}, "hparams.learning_rate: expected float, got bool False"),
        ({"double_q": 0}, "hparams.double_q: expected bool, got int 0"),
        ({"gamma": None}, "hparams.gamma: expected float, got None"),
        ({"hidden_dim_base": "64"}, "hparams.hidden_dim_base: expected int or null, got str '64'"),
        ({"net_arch": [64, 1.5]}, "hparams.net_arch: expected int, got float 1.5"),
        ({"net_arch": 64}, "hparams.net_arch: expected list or null, got int 64"),
    ],
)
def test_wrong_types_are_one_line_naming_the_key(hparams: dict[str, object], message: str) -> None:
    with pytest.raises(HParamError) as caught:
        parse_hparams(dqn.DQNHyperparams, hparams, "dqn")
    assert str(caught.value) == message


def test_an_unknown_key_lists_the_known_ones() -> None:
    with pytest.raises(HParamError) as caught:
        parse_hparams(MODELS["linear"].hparams_class, {"alpah": 1.0}, "linear")
    known = ", ".join(f.name for f in dataclasses.fields(MODELS["linear"].hparams_class))
    assert str(caught.value) == f"hparams.alpah: unknown linear hyperparameter (known: {known})"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no pydantic dump behind it
