"""Configuration: schema validation with one-line errors, cross-key checks, and per-job seeds."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marketrl.settings.contract_specs import contract_spec_problem
from marketrl.settings.registry import MODEL_NAMES

if TYPE_CHECKING:
    import jsonschema

# jsonschema and yaml are imported where they are used: jobs import this module for derive_seed only.

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"

#: Defaults that come from code rather than the schema file: the model list is the registry's
#: (`marketrl.settings.registry.MODEL_NAMES`, names only: the DAG parse imports no model).
CODE_DEFAULTS: dict[str, Any] = {"training.models": list(MODEL_NAMES)}


class ConfigError(ValueError):
    """A configuration value is missing, misspelt or impossible; the message names the key."""


def load_schema(path: Path = SCHEMA_PATH) -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of config.yaml."""
    import yaml

    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _key_path(error: jsonschema.ValidationError) -> str:
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    if error.validator == "additionalProperties":
        # The offending key is only in the message; name it as a full dotted path.
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        path += f".{extra[0] if extra else '?'}"
    return path.lstrip(".") or "<root>"


def schema_errors(config: dict[str, Any], schema: dict[str, Any] | None = None) -> list[str]:
    """Every schema violation as a one-line message naming the dotted config key."""
    import jsonschema

    validator_cls = jsonschema.validators.validator_for(schema or load_schema())
    validator = validator_cls(schema or load_schema(), format_checker=validator_cls.FORMAT_CHECKER)
    messages = []
    for error in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        key = _key_path(error)
        if error.validator == "additionalProperties":
            known = ", ".join(sorted(error.schema.get("properties", {})))
            messages.append(f"config key '{key}': unknown key; expected one of: {known}")
        else:
            messages.append(f"config key '{key}': {error.message}")
    return messages


def _fill_defaults(config: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    for key, sub in schema.get("properties", {}).items():
        dotted = f"{prefix}{key}"
        if key not in config and (dotted in CODE_DEFAULTS or "default" in sub):
            config[key] = copy.deepcopy(CODE_DEFAULTS.get(dotted, sub.get("default")))
        if isinstance(config.get(key), dict) and sub.get("type") == "object":
            _fill_defaults(config[key], sub, f"{dotted}.")
    return config


def check_renamed_keys(config: dict[str, Any]) -> None:
    """Keys of older configs that were renamed: one line naming the new key (before the schema's generic error)."""
    training = config.get("training")
    if isinstance(training, dict) and "algos" in training:
        raise ConfigError(
            "config key 'training.algos': renamed to 'training.models' (agents and forecasters in one list, "
            f"any of: {', '.join(MODEL_NAMES)})"
        )


def known_models(extra_models: Mapping[str, str] | None = None) -> list[str]:
    """The registered models' names, then training.extra_models'."""
    return [*MODEL_NAMES, *(extra_models or {})]


def check_models(models: list[str], extra_models: Mapping[str, str] | None = None) -> None:
    """Every name of training.models is a registered model or one of training.extra_models, which must not reuse
    a registered name (one line naming the key)."""
    extra = dict(extra_models or {})
    clash = [name for name in extra if name in MODEL_NAMES]
    if clash:
        raise ConfigError(
            f"config key 'training.extra_models.{clash[0]}': {clash[0]!r} is a registered model; choose another name"
        )
    known = known_models(extra)
    unknown = [name for name in models if name not in known]
    if unknown:
        raise ConfigError(
            f"config key 'training.models': unknown model {unknown[0]!r}; known models: {', '.join(known)}"
        )


def check_semantics(config: dict[str, Any]) -> None:
    """Cross-key checks that a JSON schema cannot express; raise ConfigError naming the key."""
    check_models(config["training"]["models"], config["training"]["extra_models"])
    known = known_models(config["training"]["extra_models"])
    for name in config["hyperopt"].get("fixed", {}):
        if name not in known:
            raise ConfigError(
                f"config key 'hyperopt.fixed.{name}': unknown model {name!r}; known models: {', '.join(known)}"
            )
    data = config["data"]
    if data["source"] == "files" and not data["files"].strip():
        raise ConfigError(
            "config key 'data.files': empty glob; data.source=files needs a glob of .dbn.zst files"
        )
    user = config["features"]["user"]
    if user and (not user.endswith(".py") or not Path(user).is_file()):
        raise ConfigError(
            f"config key 'features.user': {user}: no such Python file (a .py file defining FEATURES, relative to "
            "the working directory)"
        )
    folds = config["folds"]
    if folds["validation_days"] >= folds["train_days"]:
        raise ConfigError(
            "config key 'folds.validation_days': must be smaller than folds.train_days "
            f"({folds['validation_days']} >= {folds['train_days']})"
        )
    if folds["max_train_days"] is not None and folds["max_train_days"] < folds["train_days"]:
        raise ConfigError(
            "config key 'folds.max_train_days': must be null or at least folds.train_days "
            f"({folds['max_train_days']} < {folds['train_days']})"
        )
    if folds["tuning_validation_days"] >= folds["tuning_days"]:
        raise ConfigError(
            "config key 'folds.tuning_validation_days': must be smaller than folds.tuning_days "
            f"({folds['tuning_validation_days']} >= {folds['tuning_days']})"
        )
    if config["hyperopt"]["workers"] > config["hyperopt"]["n_trials"]:
        raise ConfigError(
            "config key 'hyperopt.workers': more workers than hyperopt.n_trials "
            f"({config['hyperopt']['workers']} > {config['hyperopt']['n_trials']})"
        )
    if config["hyperopt"]["grace_seconds"] <= config["hyperopt"]["heartbeat_seconds"]:
        raise ConfigError(
            "config key 'hyperopt.grace_seconds': must exceed hyperopt.heartbeat_seconds "
            f"({config['hyperopt']['grace_seconds']} <= {config['hyperopt']['heartbeat_seconds']})"
        )
    check_fill_delay_config(config)
    predict = config["predict"]
    unknown = [name for name in predict["models"] if name not in config["training"]["models"]]
    if unknown:
        raise ConfigError(
            f"config key 'predict.models': {unknown[0]!r} is not trained (training.models: "
            f"{', '.join(config['training']['models'])})"
        )
    if predict["fold"] >= folds["n"]:
        raise ConfigError(
            f"config key 'predict.fold': no fold {predict['fold']} (folds.n is {folds['n']}; -1 = the last fold)"
        )


_BAR_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
# Quote schemas at 1 s resolution or finer (marketrl.data.quotes.FINE_QUOTE_SCHEMAS, which the features job
# checks against the files' headers); bars of these schemas carry their own quotes.
_BOOK_BAR_SCHEMAS = ("tbbo", "mbp-1", "mbp-10")


def check_fill_delay_config(config: Mapping[str, Any]) -> None:
    """``env.fill_delay`` against what the config alone tells: shorter than ``data.bar_size``, and, where the
    quotes' schema is known before any file is read (the demo's bbo-1m quotes; a download of a trade-only schema
    without quotes), at 1 s resolution or finer. Quote files of ``data.quotes`` are checked by the features job
    (their headers). Raises ConfigError naming the key."""
    delay = float(config["env"].get("fill_delay", 0))
    if delay == 0:
        return
    data = config["data"]
    bar_size = str(data["bar_size"])
    bar_seconds = int(bar_size[:-1]) * _BAR_UNIT_SECONDS[bar_size[-1]]
    if delay >= bar_seconds:
        raise ConfigError(
            f"config key 'env.fill_delay': {delay:g} s is not shorter than a bar (data.bar_size {bar_size}); the "
            "delayed fill must come before the next decision"
        )
    quotes, source = data.get("quotes", "").strip(), data["source"]
    found = None  # a glob under another source than files is data.quotes' own error (pipeline.quote_inputs)
    if source == "demo" and quotes == "demo":
        found = "the demo's bbo-1m quotes"
    elif source == "demo" and not quotes:
        found = "no quotes (the demo's ohlcv-1m bars, data.quotes unset)"
    elif source == "databento" and quotes in ("", "demo"):
        schema = data["databento"]["schema"]
        if schema not in _BOOK_BAR_SCHEMAS:
            found = f"no quotes (data.databento.schema {schema}, no quote files)"
    if found is not None:
        raise ConfigError(
            f"config key 'env.fill_delay': {delay:g} s needs quotes at 1 s resolution or finer (bbo-1s or mbp-1 "
            f"files in data.quotes, or tbbo/mbp-1/mbp-10 bars), found {found}"
        )


def check_contract_specs(config: Mapping[str, Any]) -> None:
    """A futures config prices every instrument with a spec the user wrote (never a silent one); run after
    ``data.definitions`` is merged (rules/common.smk) and raise ConfigError naming the key."""
    problem = contract_spec_problem(config["costs"])
    if problem is not None:
        raise ConfigError(f"config key '{problem[0]}': {problem[1]}")


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of `config` with defaults filled in; raise ConfigError on the first problem."""
    check_renamed_keys(config)
    errors = schema_errors(config)
    if errors:
        raise ConfigError(errors[0])
    full = _fill_defaults(copy.deepcopy(config), load_schema())
    check_semantics(full)
    return full


def load_config(path: str | Path) -> dict[str, Any]:
    """Read and validate a YAML config file."""
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}".splitlines()[0]) from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys at the top level")
    return validate_config(raw)


def derive_seed(root_seed: int, *parts: str | int) -> int:
    """A stable 31-bit seed from the root seed and a job's identity, e.g. ("train", "ppo", fold, seed_index)."""
    text = "/".join(str(p) for p in (root_seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF
