"""Validation of hyperparameters and run settings, shared by every trainer: a plain dict (hyperopt JSON) becomes a
frozen dataclass, and a bad value is a one-line error naming ``hparams.<key>`` or ``training.<key>``."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["AgentConfigError", "HParamError", "check_ranges", "check_run_setting", "parse_hparams", "require"]


class HParamError(ValueError):
    """A hyperparameter is unknown, of the wrong type or out of range."""


class AgentConfigError(ValueError):
    """A run setting (``training.*``) of a trainer config is invalid."""


def check_run_setting(key: str, value: Any, minimum: int) -> None:
    """Raise ``AgentConfigError`` unless ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AgentConfigError(f"training.{key}: expected an integer >= {minimum}, got {value!r}")


_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "positive": (lambda v: v > 0, "a number > 0"),
    "positive_or_null": (lambda v: v is None or v > 0, "> 0 or null"),
    "non_negative": (lambda v: v >= 0, "a number >= 0"),
    "at_least_one": (lambda v: v >= 1, "an integer >= 1"),
    "unit": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "unit_above_zero": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
}


def check_ranges(hp: Any, **groups: tuple[str, ...]) -> None:
    """Raise ``HParamError`` for the first field of ``hp`` outside its group's range; groups are the keys of
    ``_RANGES`` (``positive=("learning_rate",), unit=("gamma",), ...``)."""
    for group, keys in groups.items():
        holds, expectation = _RANGES[group]
        for key in keys:
            require(holds(getattr(hp, key)), key, expectation, getattr(hp, key))


def parse_hparams(cls: type, hparams: Mapping[str, Any] | None, algo: str) -> Any:
    """Build the frozen hyperparameter dataclass ``cls`` from a plain dict (e.g. hyperopt JSON).

    Unknown keys and wrong types raise ``HParamError`` naming ``hparams.<key>``; an int is accepted where a float
    is expected, a bool never counts as a number.
    """
    hparams = dict(hparams or {})
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    for key, value in hparams.items():
        if key not in hints:
            raise HParamError(f"hparams.{key}: unknown {algo} hyperparameter (known: {', '.join(known)})")
        hparams[key] = _coerce(key, value, hints[key])
    result = cls(**hparams)
    check = getattr(result, "validate", None)
    if check is not None:
        check()
    return result


def _coerce(key: str, value: Any, hint: Any) -> Any:
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) in allowed:
            return None
        raise HParamError(f"hparams.{key}: expected {_describe(allowed)}, got None")
    for kind in allowed:
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if typing.get_origin(kind) is list and isinstance(value, list | tuple):
            return [_coerce(key, item, typing.get_args(kind)[0]) for item in value]
    raise HParamError(f"hparams.{key}: expected {_describe(allowed)}, got {type(value).__name__} {value!r}")


def _describe(allowed: tuple[Any, ...]) -> str:
    names = ["null" if kind is type(None) else getattr(kind, "__name__", str(kind)) for kind in allowed]
    return " or ".join(names)


def require(condition: bool, key: str, expectation: str, value: Any) -> None:
    """Raise ``HParamError`` for ``hparams.<key>`` unless ``condition`` holds."""
    if not condition:
        raise HParamError(f"hparams.{key}: expected {expectation}, got {value!r}")
