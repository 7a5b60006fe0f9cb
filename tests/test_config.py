"""Config schema: the defaults validate; misspelt keys, wrong types and impossible values fail naming the key."""

from __future__ import annotations

import copy
import hashlib
import re

import pytest
import yaml

from marketrl.instruments.costs import CostConfigError, costs_from_config
from marketrl.settings.config import (
    CODE_DEFAULTS,
    MODEL_NAMES,
    ConfigError,
    check_contract_specs,
    derive_seed,
    load_config,
    schema_errors,
    validate_config,
)
from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def default_config() -> dict:
    with open(REPO_ROOT / "config.yaml", encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _with(config: dict, dotted: str, value: object) -> dict:
    out = copy.deepcopy(config)
    *parents, last = dotted.split(".")
    node = out
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


def test_default_and_tiny_configs_validate(default_config: dict) -> None:
    assert schema_errors(default_config) == []
    full = load_config(REPO_ROOT / "tests" / "configs" / "tiny.yaml")
    assert full["training"]["device"] == "cpu"
    assert full["costs"]["model"] == "futures"  # filled in from the schema's defaults


@pytest.mark.parametrize("preset", sorted(path.name for path in (REPO_ROOT / "configs").glob("*.yaml")))
def test_every_preset_merged_over_the_defaults_validates(default_config: dict, preset: str) -> None:
    """configs/*.yaml are merged over config.yaml (`--configfile=`): each one changes only known keys."""
    from tests.faults.pipeline import merged

    overrides = yaml.safe_load((REPO_ROOT / "configs" / preset).read_text(encoding="utf-8"))
    assert overrides and schema_errors(merged(default_config, overrides)) == []


@pytest.mark.parametrize("name", ["tiny.yaml", "zoo.yaml"])
def test_test_configs_cost_each_instrument_with_its_own_spec(name: str) -> None:
    """The end-to-end configs price NQ as NQ ($5.00 a tick), not with the flat ES keys."""
    costs = costs_from_config(load_config(REPO_ROOT / "tests" / "configs" / name)["costs"])
    es, nq = costs.for_symbol("ES.c.0"), costs.for_symbol("NQ.c.0")
    assert (es.tick_size, es.tick_value / es.tick_size) == (0.25, 50.0)
    assert (nq.tick_size, nq.tick_value / nq.tick_size) == (0.25, 20.0)
    with pytest.raises(CostConfigError, match=r"no contract spec for instrument 'CL\.c\.0'"):
        costs.for_symbol("CL.c.0")  # no catch-all: an instrument without a spec is an error


def test_every_schema_key_has_description_and_default() -> None:
    schema = yaml.safe_load((REPO_ROOT / "schemas" / "config.schema.yaml").read_text())

    def walk(node: dict, path: str) -> None:
        if "propertyNames" in node:  # a map keyed by user names (costs.instruments): its values are checked
            entry = node["additionalProperties"]
            if entry.get("type") != "object":  # plain values (training.extra_models: "module:SPEC" strings)
                assert entry.get("type") and node.get("description"), f"{path}: untyped or undescribed"
                return
            if "propertyNames" in entry:  # a map of maps (hyperopt.fixed: model -> parameter -> value)
                walk(entry, f"{path}.<name>")
                return
            assert entry.get("additionalProperties") is False, (
                f"{path}.<name>: additionalProperties must be false"
            )
            assert all(sub.get("description") for sub in entry["properties"].values()), (
                f"{path}: no description"
            )
            return
        assert node.get("additionalProperties") is False, (
            f"{path or '<root>'}: additionalProperties must be false"
        )
        for key, sub in node["properties"].items():
            where = f"{path}.{key}".lstrip(".")
            assert sub.get("description"), f"{where}: no description"
            assert ("default" in sub) != (where in CODE_DEFAULTS), f"{where}: no default, or two"
            if sub.get("type") == "object":
                walk(sub, where)

    walk(schema, "")


def test_empty_config_gets_every_default() -> None:
    full = validate_config({})
    assert full["folds"]["n"] == 3
    assert full["training"]["models"] == list(MODEL_NAMES)
    assert full["training"]["models"][:3] == ["dqn", "ppo", "linear"]
    assert full["hyperopt"]["seeds_per_trial"] == 3


def test_old_algos_key_names_training_models(default_config: dict) -> None:
    config = copy.deepcopy(default_config)
    config["training"].pop("models", None)
    config["training"]["algos"] = ["dqn", "ppo"]
    with pytest.raises(ConfigError) as excinfo:
        validate_config(config)
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith("config key 'training.algos': renamed to 'training.models'")


def test_unknown_model_lists_the_known_ones(default_config: dict) -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_config(_with(default_config, "training.models", ["dqn", "xgboost"]))
    assert str(excinfo.value) == (
        "config key 'training.models': unknown model 'xgboost'; known models: " + ", ".join(MODEL_NAMES)
    )


@pytest.mark.parametrize(
    ("dotted", "value", "named"),
    [
        ("dat", {}, "dat"),
        ("data.sorce", "demo", "data.sorce"),
        ("data.demo.dayz", 3, "data.demo.dayz"),
        ("training.precison", "bf16", "training.precison"),
    ],
)
def test_unknown_keys_are_named(default_config: dict, dotted: str, value: object, named: str) -> None:
    with pytest.raises(ConfigError, match=f"'{named}': unknown key"):
        validate_config(_with(default_config, dotted, value))


@pytest.mark.parametrize(
    ("dotted", "value"),
    [
        ("folds.n", -1),
        ("folds.n", "three"),
        ("folds.test_days", 0),
        ("training.models", ["dqn", "a2c"]),
        ("training.models", []),
        ("training.horizon", 0),
        ("training.max_updates", 0),
        ("hyperopt.seeds_per_trial", 0),
        ("training.precision", "fp8"),
        ("training.device", "tpu"),
        ("data.source", "csv"),
        ("data.demo.start", "2024/01/02"),
        ("costs.tick_size", 0),
        ("hyperopt.n_trials", 0),
        ("env.fill", "mid"),
    ],
)
def test_wrong_types_and_impossible_values_are_named(
    default_config: dict, dotted: str, value: object
) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"config key '{dotted}")):
        validate_config(_with(default_config, dotted, value))


def test_errors_are_one_line(default_config: dict) -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_config(_with(default_config, "folds.n", -1))
    assert "\n" not in str(excinfo.value)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"data.source": "files", "data.files": ""}, "data.files"),
        ({"folds.validation_days": 12, "folds.train_days": 12}, "folds.validation_days"),
        ({"folds.tuning_validation_days": 5, "folds.tuning_days": 5}, "folds.tuning_validation_days"),
        ({"folds.max_train_days": 11, "folds.train_days": 12}, "folds.max_train_days"),
        ({"hyperopt.workers": 9, "hyperopt.n_trials": 8}, "hyperopt.workers"),
    ],
)
def test_cross_key_checks(default_config: dict, changes: dict, named: str) -> None:
    config = default_config
    for dotted, value in changes.items():
        config = _with(config, dotted, value)
    with pytest.raises(ConfigError, match=f"'{named}'"):
        validate_config(config)


@pytest.mark.parametrize(
    ("costs", "named"),
    [
        ({}, "costs.instruments"),  # no costs section: there is no default contract (CL must not cost as ES)
        ({"model": "futures", "instruments": {}}, "costs.instruments"),
        ({"tick_size": 0.25}, "costs.tick_value"),
        (
            {"tick_value": 12.5, "instruments": {"ES": {"tick_size": 0.25, "tick_value": 12.5}}},
            "costs.tick_size",
        ),
    ],
)
def test_futures_without_a_contract_spec_fail_in_one_line_naming_the_key(costs: dict, named: str) -> None:
    """rules/common.smk runs check_contract_specs after data.definitions is merged, before any job."""
    config = validate_config({"costs": costs})
    with pytest.raises(ConfigError, match=f"^config key '{re.escape(named)}': ") as excinfo:
        check_contract_specs(config)
    assert "\n" not in str(excinfo.value)
    if named == "costs.instruments":
        assert "ES: {tick_size: 0.25, tick_value: 12.5}" in str(excinfo.value)
        assert "data.definitions" in str(excinfo.value) and "costs.tick_size and costs.tick_value" in str(
            excinfo.value
        )


@pytest.mark.parametrize(
    "costs",
    [
        {"model": "bps"},  # bps needs no contract spec
        {"tick_size": 0.01, "tick_value": 10.0},  # the explicit flat catch-all
        {"instruments": {"default": {"tick_size": 0.01, "tick_value": 10.0}}},
    ],
)
def test_a_contract_spec_the_user_wrote_passes(costs: dict, default_config: dict) -> None:
    check_contract_specs(validate_config({"costs": costs}))
    check_contract_specs(validate_config(default_config))  # config.yaml: ES and NQ per instrument


def test_load_config_rejects_non_mapping(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml"):
        load_config(path)


def test_derived_seeds_are_stable_and_distinct() -> None:
    # Pinned values: a change here changes every job's seed and so every result. The formula, written out
    # independently: the first 4 bytes of sha256 of "root/part/...", little-endian, top bit cleared.
    assert derive_seed(1, "train", "ppo", 0, 0) == 190017104
    digest = hashlib.sha256(b"11/train/dqn/0/0").digest()
    assert derive_seed(11, "train", "dqn", 0, 0) == int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
    assert derive_seed(11, "train", "dqn", 0, 0) == 2104828805
    base: tuple[int | str, ...] = (1, "train", "ppo", 0, 0)
    for i, part in enumerate(base):  # every part of the identity counts
        changed = list(base)
        changed[i] = part + 1 if isinstance(part, int) else part + "x"
        assert derive_seed(*changed) != derive_seed(*base), f"argument {i} does not change the seed"
    assert derive_seed(1, "train", "ppo", 0) != derive_seed(1, "train", "ppo", 0, 0)  # nor does its length
    seeds = {
        derive_seed(1, "train", model, fold, s)
        for model in ("dqn", "ppo")
        for fold in range(5)
        for s in range(5)
    }
    assert len(seeds) == 50
    assert all(0 <= seed < 2**31 for seed in seeds)
