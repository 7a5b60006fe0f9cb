"""Validation of hyperparameters and run settings, shared by every trainer: a plain dict (hyperopt JSON) becomes a
frozen dataclass (types checked by pydantic, ranges by the dataclass's ``validate``), and a bad value is a one-line
error naming ``hparams.<key>`` or ``training.<key>``."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import pydantic
from typing_extensions import TypedDict

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


def parse_hparams(cls: type, hparams: Mapping[str, Any] | None, model: str) -> Any:
    """Build the frozen hyperparameter dataclass ``cls`` from a plain dict (e.g. hyperopt JSON), then run its
    ``validate()`` range checks.

    The types are validated by pydantic in strict mode against ``cls``'s field annotations: unknown keys and wrong
    types raise ``HParamError`` naming ``hparams.<key>``; an int is accepted (as a float) where a float is
    expected, a bool never counts as a number, a number never as a bool.
    """
    given = dict(hparams or {})
    try:
        values = _validator(cls).validate_python(given)
    except pydantic.ValidationError as err:
        raise HParamError(_message(cls, given, model, err.errors()[0])) from None
    result = cls(**values)
    check = getattr(result, "validate", None)
    if check is not None:
        check()
    return result


@functools.cache
def _field_hints(cls: type) -> dict[str, Any]:
    """The annotation of every ``__init__`` field of the dataclass ``cls``, in field order."""
    hints = typing.get_type_hints(cls)
    return {field.name: hints[field.name] for field in dataclasses.fields(cls) if field.init}


@functools.cache
def _validator(cls: type) -> pydantic.TypeAdapter[dict[str, Any]]:
    """A strict pydantic validator of a dict of ``cls``'s fields: any subset of them, no other key."""
    schema = TypedDict(f"{cls.__name__}Input", _field_hints(cls), total=False)
    config = pydantic.ConfigDict(strict=True, extra="forbid")
    return pydantic.TypeAdapter(pydantic.with_config(config)(schema))


def _message(cls: type, given: Mapping[str, Any], model: str, error: Mapping[str, Any]) -> str:
    """The one-line message of pydantic's first ``error``: the key, what its annotation expects, what it got."""
    key, *path = error["loc"]
    if error["type"] == "extra_forbidden":
        return f"hparams.{key}: unknown {model} hyperparameter (known: {', '.join(_field_hints(cls))})"
    hint = _field_hints(cls)[key]
    for step in path:  # into a list's items (``loc`` is ``(key, index)``)
        if isinstance(step, int):
            hint = next(
                typing.get_args(kind)[0] for kind in _members(hint) if typing.get_origin(kind) is list
            )
    value = error["input"] if path else given[key]
    got = "None" if value is None else f"{type(value).__name__} {value!r}"
    return f"hparams.{key}: expected {_describe(hint)}, got {got}"


def _members(hint: Any) -> tuple[Any, ...]:
    return typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)


def _describe(hint: Any) -> str:
    names = [
        "null" if kind is type(None) else getattr(kind, "__name__", str(kind)) for kind in _members(hint)
    ]
    return " or ".join(names)


def require(condition: bool, key: str, expectation: str, value: Any) -> None:
    """Raise ``HParamError`` for ``hparams.<key>`` unless ``condition`` holds."""
    if not condition:
        raise HParamError(f"hparams.{key}: expected {expectation}, got {value!r}")
