"""README's claims about the default demo hold for config.yaml: each number of the demo paragraph is the config
value it names, and the verdict it promises is one the config's minimums allow."""

from __future__ import annotations

import re

from marketrl.settings.config import load_config
from tests.conftest import REPO_ROOT


def _demo_paragraph() -> str:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("<!-- demo-claims:")
    return text[start : text.index("\n\n", start)]


def _config_value(config: dict, dotted: str) -> object:
    value: object = config
    for part in dotted.split("."):
        value = value[part]  # type: ignore[index]
    return value


def test_every_number_before_a_config_key_is_that_key() -> None:
    paragraph = _demo_paragraph()
    config = load_config(REPO_ROOT / "config.yaml")
    # "30 CME trading days (`data.demo.days`)": the number closest before a parenthesised key.
    claims = re.findall(r"(\d+)\D{0,60}?\(`([a-z_.]+)`\)", paragraph)
    # "`evaluation.min_seeds` (5)": a key followed by its value.
    claims += [(number, key) for key, number in re.findall(r"`([a-z_.]+)` \((\d+)\)", paragraph)]
    # The paragraph still states days, folds, test days, seeds and both minimums.
    assert len(claims) >= 6, claims
    for number, key in claims:
        assert int(number) == _config_value(config, key), f"README says {number} for {key}"
    assert f"all {len(config['training']['models'])} models of `training.models`" in paragraph
    assert "`data.demo.edge: 0`" in paragraph and config["data"]["demo"]["edge"] == 0


def test_the_promised_verdict_clears_the_minimums() -> None:
    paragraph = _demo_paragraph()
    config = load_config(REPO_ROOT / "config.yaml")
    pooled_days = config["folds"]["n"] * config["folds"]["test_days"]
    clears = (
        pooled_days >= config["evaluation"]["min_test_days"]
        and config["training"]["seeds"] >= config["evaluation"]["min_seeds"]
    )
    assert ("reaches a verdict" in paragraph) == clears
