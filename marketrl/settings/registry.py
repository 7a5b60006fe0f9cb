"""The model registry: every model's name and where its spec lives, as ``"module:attribute"`` strings.

Plain strings on purpose: the workflow validates ``training.models`` at every DAG parse, which must not import torch,
and only the stages that run a model import its spec (`load_spec`, called by `marketrl.training.zoo`). Every spec
is a `marketrl.models.base.ModelSpec`, its ``kind`` the model's: a forecaster's a `ModelSpec`, an RL agent's (trained
on the TradingEnv) the subclass `marketrl.agents.spec.AgentSpec`. Adding a model is its file plus one line in `REGISTRY`
(docs/ARCHITECTURE.md, "Adding a model"); ``training.extra_models`` adds entries from outside marketrl by config.

The one fact about a model the workflow needs before any import is whether its seeds can differ: a closed form
(ridge) trains and scores one run, seed 0, and the DAG plans one output instead of one per seed. Its line says
so, ``"linear": deterministic("marketrl.models.linear:SPEC")``, in the same line that registers it (`DETERMINISTIC`
is read from the lines); its spec says ``deterministic=True`` too, for the code that runs it, and the zoo refuses
to load a registry whose lines and specs disagree (`marketrl.training.zoo`).

The code hashes of the stages follow these strings as imports (`marketrl.workflow.stages.stage_sources`): a
module that imports `load_spec` depends on every registered module.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DETERMINISTIC",
    "MODEL_NAMES",
    "REGISTRY",
    "RegistryError",
    "deterministic",
    "load_spec",
    "names_under",
    "registered_modules",
    "spec_location",
]


class _Deterministic(str):
    """A registry location marked deterministic: a plain ``"module:attribute"`` string everywhere else."""

    __slots__ = ()


def deterministic(location: str) -> str:
    """``location``, marked: the model's seeds cannot differ (a closed form), so the pipeline trains and scores
    one run of it, seed 0, not copies. Its spec must say ``deterministic=True`` as well."""
    return _Deterministic(location)


#: name -> "module:attribute" of its spec, in the default order of training.models (the agents, then the
#: forecasters); `deterministic(...)` around the location of a model whose seeds cannot differ. One line per model.
REGISTRY: dict[str, str] = {
    "dqn": "marketrl.agents.dqn:SPEC",
    "ppo": "marketrl.agents.ppo:SPEC",
    "linear": deterministic("marketrl.models.linear:SPEC"),
    "lightgbm": "marketrl.models.lightgbm_model:SPEC",
    "mlp": "marketrl.models.mlp:SPEC",
    "lstm": "marketrl.models.lstm:SPEC",
    "gru": "marketrl.models.gru:SPEC",
    "alstm": "marketrl.models.alstm:SPEC",
    "tcn": "marketrl.models.tcn:SPEC",
    "transformer": "marketrl.models.transformer:SPEC",
    "dlinear": "marketrl.models.dlinear:SPEC",
}
MODEL_NAMES = tuple(REGISTRY)
#: The registered models whose seeds cannot differ, read from their lines: the pipeline trains and scores one run
#: of them, seed 0, not copies.
DETERMINISTIC: tuple[str, ...] = tuple(
    name for name, location in REGISTRY.items() if isinstance(location, _Deterministic)
)

_LOCATION = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):([A-Za-z_]\w*)$")


class RegistryError(ValueError):
    """A spec location is malformed, or does not name a model spec."""


def spec_location(location: str) -> tuple[str, str]:
    """(module, attribute) of a ``"module:attribute"`` string."""
    match = _LOCATION.match(location)
    if match is None:
        raise RegistryError(f"{location!r}: expected 'package.module:ATTRIBUTE'")
    return match.group(1), match.group(2)


def load_spec(location: str) -> Any:
    """Import the spec a location names (the module is imported once; later calls are a dict lookup)."""
    module_name, attribute = spec_location(location)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise RegistryError(f"{location!r}: cannot import {module_name} ({error})") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise RegistryError(f"{location!r}: {module_name} has no {attribute}") from None


def names_under(package: str, registry: Mapping[str, str] = REGISTRY) -> tuple[str, ...]:
    """The registered names whose spec lives in ``package`` (e.g. the agents of ``marketrl.agents``), in order."""
    return tuple(name for name, location in registry.items() if location.startswith(f"{package}."))


def registered_modules(registry: Mapping[str, str] = REGISTRY) -> tuple[str, ...]:
    """The modules the registry's locations name, in order."""
    return tuple(dict.fromkeys(spec_location(location)[0] for location in registry.values()))
