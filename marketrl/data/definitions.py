"""Contract specs from Databento ``definition`` files (``data.definitions``), merged into ``costs.instruments``.

A futures definition record (``InstrumentDefMsg``, instrument_class F) gives the tick size
(``min_price_increment``), the contract multiplier (``unit_of_measure_qty``, e.g. 50 index points for ES) and the
currency; the tick value is their product (ES: 0.25 × 50 = 12.50 USD; NQ: 0.25 × 20 = 5.00 USD).
``min_price_increment_amount`` is not used: CME publishes it in display-factor units (0.125 for ES), not currency.
Specs are keyed by symbol root (``marketrl.instruments.costs.symbol_root``: ESH4 and ESM4 -> ES); every contract of a root
must agree. Options, spreads, stocks and records without a tick size or multiplier give no spec.

rules/common.smk calls ``resolve_definitions`` at DAG parse, so every job reads the merged specs in its
``costs.instruments`` slice (and reruns when they change). An explicit ``costs.instruments`` entry wins for its
root; its tick size and tick value must agree with the definitions' (a one-line error names both otherwise).
Only ``databento_dbn`` and ``zstandard`` are imported (no databento, polars or pandas).
"""

from __future__ import annotations

import copy
import glob
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import databento_dbn as dbn
import zstandard

from marketrl.data.file_order import DEMO_DEFINITIONS_DIR
from marketrl.settings.config import ConfigError, validate_config

__all__ = [
    "ContractSpec",
    "definition_files",
    "demo_run_config",
    "read_contract_specs",
    "resolve_definitions",
]

KEY = "data.definitions"
_UNDEF_PRICE = dbn.UNDEF_PRICE
_SCALE = 1e9
_TOLERANCE = 1e-9  # relative: specs that differ by more are different contracts


@dataclass(frozen=True)
class ContractSpec:
    """One root's contract spec, and the definition record it came from (for error messages)."""

    tick_size: float
    tick_value: float
    currency: str | None
    source: str  # "ESH4 in <file>"

    def to_config(self) -> dict[str, Any]:
        """As a ``costs.instruments`` entry."""
        entry: dict[str, Any] = {"tick_size": self.tick_size, "tick_value": self.tick_value}
        if self.currency:
            entry["currency"] = self.currency
        return entry


def definition_files(pattern: str) -> list[Path]:
    """The files ``data.definitions`` names (a path or glob); a pattern matching nothing is a one-line error."""
    matched = sorted(glob.glob(pattern, recursive=True))
    if not matched:
        raise ConfigError(f"config key '{KEY}': {pattern!r} matched no files")
    return [Path(p) for p in matched]


def _records(path: Path) -> list[Any]:
    try:
        raw = path.read_bytes()
        if raw[:4] == b"\x28\xb5\x2f\xfd":
            raw = zstandard.ZstdDecompressor().stream_reader(raw).read()
        decoder = dbn.DBNDecoder()
        decoder.write(raw)
        decoded = decoder.decode()
    except (OSError, ValueError, zstandard.ZstdError) as exc:
        raise ConfigError(f"config key '{KEY}': {path}: cannot decode: {exc}".splitlines()[0]) from exc
    if not decoded or not isinstance(decoded[0], dbn.Metadata):
        raise ConfigError(f"config key '{KEY}': {path}: not a DBN file")
    if decoded[0].schema != dbn.Schema.DEFINITION:
        raise ConfigError(
            f"config key '{KEY}': {path}: schema {decoded[0].schema}, expected a definition file"
        )
    return decoded[1:]


def _spec_of(record: Any, path: Path) -> ContractSpec | None:
    if record.instrument_class != dbn.InstrumentClass.FUTURE:
        return None
    if _UNDEF_PRICE in (record.min_price_increment, record.unit_of_measure_qty):
        return None
    tick_size, multiplier = record.min_price_increment / _SCALE, record.unit_of_measure_qty / _SCALE
    if not (tick_size > 0 and multiplier > 0):
        return None
    return ContractSpec(
        tick_size, tick_size * multiplier, record.currency or None, f"{record.raw_symbol} in {path}"
    )


def _disagree(a: float, b: float) -> bool:
    return not math.isclose(a, b, rel_tol=_TOLERANCE)


def read_contract_specs(paths: list[Path]) -> dict[str, ContractSpec]:
    """Root -> spec from the futures definitions in ``paths``; contracts of one root that disagree are an error."""
    from marketrl.instruments.costs import symbol_root  # imports torch: only when definitions are configured

    specs: dict[str, ContractSpec] = {}
    for path in paths:
        for record in _records(path):
            spec = _spec_of(record, path)
            if spec is None:
                continue
            root = symbol_root(record.raw_symbol)
            known = specs.setdefault(root, spec)
            if _disagree(known.tick_size, spec.tick_size) or _disagree(known.tick_value, spec.tick_value):
                raise ConfigError(
                    f"config key '{KEY}': contracts of {root} disagree: {known.source} has tick "
                    f"{known.tick_size:g} / {known.tick_value:g}, {spec.source} {spec.tick_size:g} / {spec.tick_value:g}"
                )
    return specs


def _explicit_tick_value(entry: Mapping[str, Any], spec: ContractSpec) -> float | None:
    if "tick_value" in entry:
        return float(entry["tick_value"])
    if "multiplier" in entry:
        return float(entry["multiplier"]) * float(entry.get("tick_size", spec.tick_size))
    return None


def resolve_definitions(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with ``costs.instruments`` completed from ``data.definitions`` (unchanged when it is "").

    Explicit entries win; an explicit tick size or tick value that disagrees with the definitions is an error.
    With ``costs.model: bps`` the definitions add nothing (a bps cost needs no tick)."""
    pattern = str(config["data"].get("definitions") or "").strip()
    resolved = copy.deepcopy(dict(config))
    if not pattern:
        return resolved
    specs = read_contract_specs(definition_files(pattern))
    if not specs:
        raise ConfigError(f"config key '{KEY}': {pattern!r} holds no futures definition with a tick size")
    costs = resolved["costs"]
    if costs.get("model", "futures") != "futures":
        return resolved
    explicit = dict(costs.get("instruments") or {})
    for root, entry in explicit.items():
        spec = specs.get(str(root))
        if spec is None or not isinstance(entry, Mapping):
            continue
        tick_value = _explicit_tick_value(entry, spec)
        if ("tick_size" in entry and _disagree(float(entry["tick_size"]), spec.tick_size)) or (
            tick_value is not None and _disagree(tick_value, spec.tick_value)
        ):
            raise ConfigError(
                f"config key 'costs.instruments.{root}': tick {entry.get('tick_size')} / {tick_value} disagrees "
                f"with {spec.source} ({spec.tick_size:g} / {spec.tick_value:g}); fix or remove one of them"
            )
    merged = {root: spec.to_config() for root, spec in sorted(specs.items())}
    for root, entry in explicit.items():
        base = merged.get(str(root), {})
        if "multiplier" in entry or "tick_value" in entry:
            base = {k: v for k, v in base.items() if k != "tick_value"}
        merged[str(root)] = {**base, **entry}
    costs["instruments"] = merged
    return resolved


def demo_run_config(raw_dir: Path, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The full config of a run outside the pipeline (bench/) on the demo files ``generate_demo_files`` wrote to
    ``raw_dir``: the schema's defaults and ``overrides``, every instrument's contract spec read from the demo's
    definition file as ``data.definitions`` would (so NQ is costed as NQ, not with the flat ES keys)."""
    config = copy.deepcopy(dict(overrides or {}))
    config.setdefault("data", {})["definitions"] = str(Path(raw_dir) / DEMO_DEFINITIONS_DIR / "*")
    return resolve_definitions(validate_config(config))
