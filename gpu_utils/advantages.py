"""Generalized advantage estimation where it is cheapest: on the host for a small table, on the device for a large one.

A trajectory table is [T, C]: T time steps of C independent columns (every trajectory of every copy trained as
one batch). GAE is a reverse scan over T, elementwise over C:

    place = gae_place(columns, device)                 # "host" or "device" (or forced by the caller)
    advantages, returns = gae_host(...)                # numpy arrays [T, C], after one device→host copy
    advantages, returns = gae_device(...)              # torch tensors [T, C], no host copy at all

For a small C the scan's T steps are cheaper as numpy loops over one host copy the caller makes anyway (its
statistics want the table) than as T small device kernels; for a large C the copy of the whole table and the numpy
passes over it dominate, and the device scan (T launches of a few elementwise ops over C) wins. Both
accumulate in float64 in the same order, so the two places agree to the bit. `episode_sums` does the same for the
running returns of episodes that end inside the table.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

__all__ = ["GAE_DEVICE_MIN_COLUMNS", "GaePlace", "episode_sums", "gae_device", "gae_host", "gae_place"]

GaePlace = Literal["auto", "host", "device"]

#: Columns from which an accelerator's scan beats the host copy + numpy scan. An estimate, not a measurement: the
#: device side is ~3 T + 40 kernels of ~5 µs whatever C (T = 64: ~1.2 ms), the host side measured 1.4 ms at
#: 1,024 columns and 5.2 ms at 4,096 (T = 64, bench/speed/gae.py on the CPU machine). `bench/gpu/gpu_check.py`'s
#: ``gae`` section measures the crossover on a device.
GAE_DEVICE_MIN_COLUMNS = 2048


def gae_place(
    columns: int, device: torch.device | str, place: GaePlace = "auto"
) -> Literal["host", "device"]:
    """Where to run GAE over ``columns`` trajectories: ``place`` if forced; on the CPU always the host side
    (numpy beats torch's CPU kernels 1.7–5× from 256 to 262,144 columns: bench/speed/gae.py); on an
    accelerator the device from `GAE_DEVICE_MIN_COLUMNS` columns."""
    if place not in ("auto", "host", "device"):
        raise ValueError(f"gae place must be 'auto', 'host' or 'device', got {place!r}")
    if place != "auto":
        return place
    if torch.device(device).type == "cpu":
        return "host"
    return "device" if columns >= GAE_DEVICE_MIN_COLUMNS else "host"


def gae_host(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    gae_lambda: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns, all arrays [T, C]; loops over time only.

    ``next_values[t]`` is V of the true next state of step t (the final state where an episode ended), so a
    truncated step bootstraps from it while a terminated one does not; the recursion never crosses an episode end.
    """
    deltas = rewards + gamma * next_values * (1.0 - terminated) - values
    carry = gamma * gae_lambda * (1.0 - np.maximum(terminated, truncated))
    advantages = np.empty_like(deltas)
    running = np.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = deltas[t] + carry[t] * running
        advantages[t] = running
    return advantages, advantages + values


def gae_device(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`gae_host` on the tensors' device, [T, C] each (any float or bool dtype): float64 advantages and returns
    [T, C], the host's to the bit (the same operations in the same order). No host sync."""
    values64 = values.double()
    ended = terminated.double()
    deltas = rewards.double() + gamma * next_values.double() * (1.0 - ended) - values64
    carry = gamma * gae_lambda * (1.0 - torch.maximum(ended, truncated.double()))
    advantages = torch.empty_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = deltas[t] + carry[t] * running  # not addcmul: a fused multiply-add rounds differently
        advantages[t] = running
    return advantages, advantages + values64


def episode_sums(
    running: torch.Tensor, rewards: torch.Tensor, done: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Advance per-column running returns ``running`` [C] (float64) over ``rewards`` [T, C] with episode ends
    ``done`` [T, C]: returns (the new running returns [C], the sum of the returns of the episodes that ended in
    the table [C], how many ended [C]). No loop over T, no host sync: a cumulative sum and, for each step, the
    cumulative sum at the column's last episode end before it."""
    n_steps = rewards.shape[0]
    ended = done.bool()
    totals = running[None] + rewards.double().cumsum(dim=0)  # [T, C]: the running return after step t
    steps = torch.arange(n_steps, device=rewards.device)[:, None].expand_as(ended)
    last_end = torch.where(ended, steps, -1).cummax(dim=0).values  # the last end at or before t
    before = torch.cat([torch.full_like(last_end[:1], -1), last_end[:-1]])  # ... strictly before t
    start = torch.where(
        before >= 0, totals.gather(0, before.clamp(min=0)), 0.0
    )  # total when t's episode began
    episode_returns = totals - start
    ended_sum = torch.where(ended, episode_returns, 0.0).sum(dim=0)
    ended_count = ended.sum(dim=0)
    final_start = torch.where(last_end[-1] >= 0, totals.gather(0, last_end[-1:].clamp(min=0))[0], 0.0)
    return totals[-1] - final_start, ended_sum, ended_count
