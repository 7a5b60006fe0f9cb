"""Random streams for S copies trained as one batch, drawn for all copies in a fixed number of device operations.

A `torch.Generator` per copy keeps each copy's randomness its own (a copy trained alone or among others draws the
same numbers), but drawing from S generators is S operations, so a loop that draws every step issues launches in
proportion to S. `SeedStreams` keeps that independence with counter-based streams: copy i's draw number k at
position j is a hash of (its key, k + j), so one set of elementwise operations over [S, n] serves every copy, a
copy's numbers never depend on the others, and holding a copy (``active`` False) leaves its stream where it was.

    streams = SeedStreams.from_generators(generators, device)     # one key per copy, from its own generator
    order = streams.permutations(n, active)                       # [S, n]: a fresh permutation per active copy
    index = streams.integers(high, n)                             # [S, n] in [0, high)
    noise = streams.uniform(n)                                    # [S, n] in (0, 1)

The hash is two rounds of a 32-bit multiply-xorshift mixer computed in int64 with multipliers below 2**31, so no
product overflows and the CPU and CUDA give the same bits. State (keys and counters, [S] int64 on the device) is in
``state_dict`` for resumable training. No host sync anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["SeedStreams"]

_LOW32 = 0xFFFFFFFF
_MULTIPLIERS = (0x7FEB352D, 0x5BD1E995)  # odd, below 2**31: a 32-bit value times one stays below 2**63


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche mixer on int64 tensors holding values in [0, 2**32)."""
    for multiplier in _MULTIPLIERS:
        x = x ^ (x >> 16)
        x = (x * multiplier) & _LOW32
    return x ^ (x >> 15)


class SeedStreams:
    """One counter-based random stream per copy (module docs): ``keys`` and ``counters``, [S] int64."""

    def __init__(self, keys: torch.Tensor) -> None:
        if keys.dim() != 1 or keys.dtype != torch.int64:
            raise ValueError(
                f"keys must be a 1-d int64 tensor, got {keys.dtype} of shape {tuple(keys.shape)}"
            )
        self.keys = keys & _LOW32
        self.counters = torch.zeros_like(keys)

    @classmethod
    def from_generators(
        cls, generators: Sequence[torch.Generator], device: torch.device | str
    ) -> SeedStreams:
        """One key per copy drawn from its own generator (one draw each, at set-up)."""
        device = torch.device(device)
        keys = torch.cat([torch.randint(0, 2**32, (1,), generator=g, device=g.device) for g in generators])
        return cls(keys if keys.device == device else keys.to(device))

    def _bits(self, n: int, active: torch.Tensor | None) -> torch.Tensor:
        """[S, n] 62-bit values; advances each active copy's counter by n."""
        positions = self.counters[:, None] + torch.arange(n, device=self.keys.device)
        first = _mix32((positions & _LOW32) ^ _mix32(self.keys[:, None] ^ (positions >> 32)))
        second = _mix32(first ^ self.keys[:, None])
        step = n if active is None else active.to(torch.int64) * n
        self.counters += step
        return ((first >> 1) << 31) | (second >> 1)

    def permutations(self, n: int, active: torch.Tensor | None = None) -> torch.Tensor:
        """[S, n] long: a random permutation of range(n) for each copy; a held copy (``active`` False) gets
        range(n) and its stream does not move."""
        order = torch.argsort(self._bits(n, active), dim=1, stable=True)
        if active is None:
            return order
        return torch.where(active[:, None], order, torch.arange(n, device=order.device))

    def uniform(self, n: int) -> torch.Tensor:
        """[S, n] float32 in (0, 1): 24 random bits at bin centres, so neither 0 nor 1 (safe under log)."""
        return ((self._bits(n, None) >> 38).to(torch.float32) + 0.5) * 2.0**-24

    def integers(self, high: int, n: int) -> torch.Tensor:
        """[S, n] long, uniform in [0, high) (bias below high / 2**62)."""
        if high < 1:
            raise ValueError(f"high must be >= 1, got {high}")
        return torch.remainder(self._bits(n, None), high)

    def state_dict(self) -> dict[str, Any]:
        return {"keys": self.keys, "counters": self.counters}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.keys.copy_(state["keys"])
        self.counters.copy_(state["counters"])
