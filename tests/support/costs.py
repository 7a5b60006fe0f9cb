"""Contract specs for test configs: there is no default contract (``marketrl.settings.config.check_contract_specs``)."""

from __future__ import annotations

#: The flat ``costs.tick_size`` + ``costs.tick_value`` pair, written on purpose: ES's spec as the catch-all of every
#: instrument while ``costs.instruments`` is {} (synthetic symbols such as S0 have no contract of their own).
CATCH_ALL_SPEC = {"tick_size": 0.25, "tick_value": 12.5}
