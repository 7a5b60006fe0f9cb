"""Whether a ``costs`` section gives futures a contract spec the user wrote: there is no default contract.

Standard library only: config validation at DAG parse (``marketrl.settings.config.check_contract_specs``) and the cost
model (``marketrl.instruments.costs.costs_from_config``, which must import nothing but torch and numpy) share it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FLAT_SPEC_KEYS = ("tick_size", "tick_value")  # costs.*: the pair the user writes as every instrument's spec
NO_SPEC_HINT = (
    "write a spec per symbol root (e.g. costs.instruments: {ES: {tick_size: 0.25, tick_value: 12.5}}), "
    "set data.definitions to Databento definition files, or write costs.tick_size and costs.tick_value "
    "as the catch-all spec of every instrument"
)


def contract_spec_problem(costs: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why a ``costs`` section leaves futures instruments without a contract spec the user wrote, as (key, why);
    None when it has one or needs none (``model: bps``). ``costs.instruments`` is read as final (after
    ``data.definitions`` has filled it in)."""
    if costs.get("model", "futures") != "futures":
        return None
    flat = [key for key in FLAT_SPEC_KEYS if costs.get(key) is not None]
    if len(flat) == 1:
        (written,) = flat
        missing = next(key for key in FLAT_SPEC_KEYS if key != written)
        return (
            f"costs.{missing}",
            f"missing beside costs.{written}; the flat pair is the catch-all spec of every instrument, write both",
        )
    if flat or costs.get("instruments"):
        return None
    return "costs.instruments", f"no contract spec for costs.model futures; {NO_SPEC_HINT}"
