"""Measured coverage of the report's intervals and error rates of its claims at the pipeline's sample sizes.

    PYTHONPATH=$PWD .venv/bin/python bench/studies/coverage.py --sims 300 --boot 500
    PYTHONPATH=$PWD .venv/bin/python bench/studies/coverage.py --sims 300 --boot 500 --only tails   # issue 23's tables
    .venv/bin/python bench/studies/coverage.py --quick      # K = 4 worlds, 40 resamples, 2,000 "true" t draws: every table in seconds

Worlds: Gaussian AR(1) daily returns (phi = 0.2 unless stated) with a known true Sharpe. Prints one markdown table per
check; docs/METRICS.md ("Coverage") records the output and the K used.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from marketrl.scoring.inference import (
    contrast_estimates,
    familywise_test,
    se_floor_for,
    sharpe_contrasts,
    studentized_sharpe_ci,
)
from marketrl.scoring.stats import stationary_bootstrap_ci, stratified_bootstrap_ci


def ar1(n: int, phi: float, true_sharpe: float, rng: np.random.Generator, columns: int = 1) -> np.ndarray:
    """[n, columns] stationary AR(1) series with unit marginal std and mean = true_sharpe (per period)."""
    shocks = rng.normal(size=(n + 50, columns)) * math.sqrt(1 - phi**2)
    x = np.zeros_like(shocks)
    for t in range(1, len(x)):
        x[t] = phi * x[t - 1] + shocks[t]
    return x[50:] + true_sharpe


def sharpe_coverage(days: list[int], sims: int, boot: int, phi: float, true_sharpe: float) -> None:
    print(f"\nSharpe CI coverage (nominal 95%), AR(1) phi={phi}, true daily Sharpe {true_sharpe}, K={sims}")
    print("| test days | percentile | bootstrap-t |\n|---|---|---|")
    for n in days:
        rng = np.random.default_rng(n)
        hits = np.zeros(2)
        for k in range(sims):
            x = ar1(n, phi, true_sharpe, rng)[:, 0] * 0.01
            for j, ci in enumerate(
                (
                    stationary_bootstrap_ci(x, n_boot=boot, seed=k),
                    studentized_sharpe_ci(x, n_boot=boot, seed=k),
                )
            ):
                hits[j] += bool(ci.lo <= true_sharpe <= ci.hi)
        print(f"| {n} | {hits[0] / sims:.2f} | {hits[1] / sims:.2f} |")


def false_claims(days: list[int], sims: int, boot: int, phi: float) -> None:
    """No-edge world: 2 models vs 3 baselines, both directions (12 hypotheses), all with zero true Sharpe."""
    print(f"\nFalse claims with no edge (2 models x 3 baselines x 2 directions), phi={phi}, K={sims}")
    print("| test days | one pair, marginal one-sided 2.5% | family, per-comparison 2.5% | Romano-Wolf 5% |")
    print("|---|---|---|---|")
    weights = []
    for model in range(2):
        for baseline in range(3):
            row = np.zeros(5)
            row[model], row[2 + baseline] = 1.0, -1.0
            weights += [row, -row]
    weights = np.array(weights)
    for n in days:
        rng = np.random.default_rng(1000 + n)
        single = family_naive = family_rw = 0
        for k in range(sims):
            x = ar1(n, phi, 0.0, rng, columns=5) * 0.01
            contrasts = sharpe_contrasts(x, weights, n_boot=boot, seed=k)
            t = contrasts.estimate / contrasts.standard_error
            naive = t > np.quantile(contrasts.t_boot, 0.975, axis=0, method="higher")
            single += bool(naive[0])
            family_naive += bool(naive.any())
            family_rw += bool(familywise_test(contrasts).reject.any())
        print(f"| {n} | {single / sims:.2f} | {family_naive / sims:.2f} | {family_rw / sims:.2f} |")


TAIL_LEVELS = (0.95, 0.99, 0.999)


def true_t_quantiles(n: int, phi: float, true_sharpe: float, worlds: int, seed: int) -> np.ndarray:
    """Quantiles TAIL_LEVELS of the true t = (SR̂ − SR)/ŝe over ``worlds`` simulated series (upper tail)."""
    rng = np.random.default_rng(seed)
    draws = []
    chunk = max(1, 2_000_000 // n)
    for start in range(0, worlds, chunk):
        rows = min(chunk, worlds - start)
        x = ar1(n, phi, true_sharpe, rng, columns=rows).T[:, :, None]  # [rows, n, 1]
        estimate, se = contrast_estimates(x, [[1.0]])
        draws.append((estimate[:, 0] - true_sharpe) / se[:, 0])
    return np.quantile(np.concatenate(draws), TAIL_LEVELS)


def t_star_tails(
    days: list[int], sims: int, boot: int, phi: float, floors: list[float], truth_worlds: int = 200_000
) -> None:
    """Pooled t* of the studentized bootstrap (K worlds × boot draws) against the true t, per SE floor."""
    true_sharpe = 0.1
    levels = " | ".join(f"q{q:g} true" for q in TAIL_LEVELS)
    ratios = " | ".join(f"q{q:g} t*/true" for q in TAIL_LEVELS)
    print(
        f"\nTails of t* vs the true studentized Sharpe, AR(1) phi={phi}, true daily Sharpe {true_sharpe}, K={sims}"
    )
    print(f"| test days | SE floor | {levels} | {ratios} |\n|---|---|" + "---|" * 2 * len(TAIL_LEVELS))
    for n in days:
        truth = true_t_quantiles(n, phi, true_sharpe, truth_worlds, seed=7 + n)
        rng = np.random.default_rng(300 + n)
        worlds = [ar1(n, phi, true_sharpe, rng)[:, :1] for _ in range(sims)]
        for floor in floors:
            pooled = np.concatenate(
                [
                    sharpe_contrasts(
                        x, [[1.0]], n_boot=boot, seed=k, se_floor=se_floor_for(n) if floor < 0 else floor
                    ).t_boot[:, 0]
                    for k, x in enumerate(worlds)
                ]
            )
            star = np.quantile(pooled[~np.isnan(pooled)], TAIL_LEVELS)
            cells = (
                " | ".join(f"{v:.2f}" for v in truth) + " | " + " | ".join(f"{r:.2f}" for r in star / truth)
            )
            label = f"{se_floor_for(n):g} (rule)" if floor < 0 else f"{floor:g}"
            print(f"| {n} | {label} | {cells} |")


def seed_iqm_coverage(seed_counts: list[int], sims: int, boot: int) -> None:
    print(f"\nSeed-IQM CI coverage (nominal 95%), normal seed scores, one fold, K={sims}")
    print("| seeds | stratified percentile bootstrap |\n|---|---|")
    for n_seeds in seed_counts:
        rng = np.random.default_rng(n_seeds)
        hits = 0
        for k in range(sims):
            ci = stratified_bootstrap_ci(rng.normal(size=n_seeds), n_boot=boot, seed=k)
            hits += bool(ci.lo <= 0.0 <= ci.hi)  # the IQM of a symmetric law is its centre
        print(f"| {n_seeds} | {hits / sims:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=None, help="simulated worlds per cell (K; 300, quick 4)")
    parser.add_argument(
        "--boot", type=int, default=None, help="bootstrap resamples per interval (500, quick 40)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="K = 4, 40 resamples: a sanity run, not a measurement"
    )
    parser.add_argument(
        "--only",
        choices=["all", "tails"],
        default="all",
        help="tails tables and the Sharpe CI coverage at 9-250 days only",
    )
    parser.add_argument(
        "--floors",
        type=float,
        nargs="+",
        default=[0.0, -1.0],
        help="SE floors to compare (-1: the report's rule, se_floor_for the number of days)",
    )
    args = parser.parse_args()
    args.sims = args.sims or (4 if args.quick else 300)
    args.boot = args.boot or (40 if args.quick else 500)
    truth_worlds = 2_000 if args.quick else 200_000  # the simulated "true" t quantiles of the tails tables
    days = [3, 5, 7, 9, 20, 40]
    print(f"bench/studies/coverage.py --sims {args.sims} --boot {args.boot}")
    for phi in (0.0, 0.5):
        t_star_tails(
            [9, 20, 60, 250], args.sims, args.boot, phi=phi, floors=args.floors, truth_worlds=truth_worlds
        )
    if args.only == "tails":
        sharpe_coverage([9, 20, 60, 250], args.sims, args.boot, phi=0.2, true_sharpe=0.1)
        return
    sharpe_coverage(days, args.sims, args.boot, phi=0.2, true_sharpe=0.1)
    for phi in (0.0, 0.2, 0.5):
        false_claims(days, args.sims, args.boot, phi=phi)
    seed_iqm_coverage([2, 3, 5, 10], args.sims, args.boot)


if __name__ == "__main__":
    main()
