"""Benchmark: DLinear's training step with per-value dropout (as before) and per-feature dropout (as now).

    .venv/bin/python bench/speed/dropout.py            # the demo study's pick: window 2, width 64, batch 1024
    .venv/bin/python bench/speed/dropout.py --quick    # a few steps: a check, seconds

DLinear's head reads F x width values a sample (51 features x 64 = 3,264 at the demo's pick). Per-value dropout
draws one random number per value, per-feature dropout (`nn.Dropout1d` on [B, F, width]) one per feature; on the
CPU the draws, not the matrix products, were the largest cost of a fold's training (cProfile of one dlinear fold:
`torch.dropout` 49 s of 112 s). Both sides run the same module, batch, optimizer and loss, interleaved round by
round in one process (torch at 1 thread), so the machine's load hits both; reported: steps/s of each and the
median per-round ratio. A check before timing: both sides start from the same weights and, with dropout 0, give
the same loss.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from marketrl.models.dlinear import DLinear, DLinearHParams

N_FEATURES = 51  # the demo's catalog (docs/FEATURES.md)


class PerValueDLinear(DLinear):
    """DLinear as it dropped before: one draw per value of the head's input."""

    def __init__(self, hp: DLinearHParams, n_features: int) -> None:
        super().__init__(hp, n_features)
        self.drop = nn.Dropout(hp.dropout)

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        series = windows.transpose(1, 2)
        half = (self.kernel - 1) // 2
        padded = nn.functional.pad(series, (half, half), mode="replicate") if half else series
        trend = nn.functional.avg_pool1d(padded, self.kernel, stride=1)
        mixed = self.trend(trend) + self.remainder(series - trend)
        return self.head(self.drop(mixed.flatten(1))).squeeze(-1)


def build(per_feature: bool, hp: DLinearHParams) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model (same seed, so the same weights on both sides) and its optimizer."""
    torch.manual_seed(0)
    model = DLinear(hp, N_FEATURES) if per_feature else PerValueDLinear(hp, N_FEATURES)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def steps_per_second(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, steps: int
) -> float:
    """Training steps a second: forward, MSE loss, backward, optimizer step."""
    model.train()
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=40, help="steps a round a side")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 steps, 2 rounds, batch 128")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds, args.batch = 3, 2, 128
    torch.set_num_threads(1)
    hp = DLinearHParams(window=args.window, hidden_dim_base=args.width, dropout=args.dropout)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.window, N_FEATURES, generator=generator)
    y = torch.randn(args.batch, generator=generator)

    # equal work: the same weights and, without dropout, the same loss
    off = DLinearHParams(window=args.window, hidden_dim_base=args.width, dropout=0.0)
    losses = [nn.functional.mse_loss(build(side, off)[0](x), y).item() for side in (False, True)]
    if losses[0] != losses[1]:
        raise SystemExit(f"unequal work: losses without dropout differ ({losses[0]} vs {losses[1]})")

    sides = {"per value": build(False, hp), "per feature": build(True, hp)}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for round_index in range(args.rounds):
        order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
        for name in order:
            rates[name].append(steps_per_second(*sides[name], x, y, args.steps))
    ratios = [new / old for new, old in zip(rates["per feature"], rates["per value"], strict=True)]
    print(
        f"DLinear window {args.window}, width {args.width}, batch {args.batch}, {N_FEATURES} features, torch 1 thread"
    )
    print("| dropout | steps/s (median) |")
    print("|---|---|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):.1f} |")
    print(f"per feature / per value: {statistics.median(ratios):.2f}x (median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
