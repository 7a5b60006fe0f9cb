"""False-claim rate (size) and power of the report's verdict families on synthetic return matrices in the report's
own layout.

    PYTHONPATH=$PWD .venv/bin/python bench/studies/verdict_size.py --sims 300 --boot 300 --matched 5 --power-sims 100
    PYTHONPATH=$PWD .venv/bin/python bench/studies/verdict_size.py ... --quiet 1 0.1   # also the quiet-model layout
    .venv/bin/python bench/studies/verdict_size.py --quick    # K = 2 at 20 days, phi 0, both layouts: in seconds

Layout (as `marketrl.verdict.verdicts.model_verdicts` builds it): 11 models × 5 seeds (seeds of one model correlated
0.5), buy & hold, flat (all-zero returns), momentum, `--random` independent random traders (the random baseline is
the mean of their Sharpes) and `--matched` turnover-matched random traders per model seed (the matched baseline of
a model is the mean Sharpe of its seeds' traders). Every series is Gaussian AR(1) with coefficient phi, daily std 1%.

`--quiet` (one layout per value, default 1): the share of days on which the last model (and its seeds' matched
traders) trades; on its other days their returns are 0. Below `VerdictRules.min_trading_share` (20%) it is flagged
low-information as in the report: left out of the primary family, not claimed, not in its critical values.

No-edge worlds: every true Sharpe is 0; a world counts as a false claim if the primary family (intersection–union
"beats every baseline", balanced min-p stepdown across models) claims any model; the secondary per-baseline families
("better than X", "worse than X") are counted too. Power worlds: model 0's five seeds get a daily Sharpe edge δ over
every baseline, δ = the median over the no-edge worlds of the report's headline figure (the median over the models
that trade of each one's "could have detected" edge); the measured power of that claim at δ is the check of the
figure (target 80%). Rates carry 95% Clopper–Pearson intervals. The same `marketrl.verdict.verdicts.family_result`
as the report does the testing.
"""

from __future__ import annotations

import argparse
import math
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import numpy as np
from scipy.stats import beta, norm

from marketrl.calendars.annual import ANNUALIZER
from marketrl.scoring.inference import minimum_detectable_sharpe_difference
from marketrl.verdict.strategies import VerdictRules
from marketrl.verdict.verdicts import family_result

N_MODELS, N_SEEDS, SEED_CORRELATION = 11, 5, 0.5
FIXED = ("buy_and_hold", "flat", "momentum")


def layout(n_random: int, n_matched: int) -> tuple[np.ndarray, np.ndarray, list[list[int]], int]:
    """(model rows, pair rows [models × 5 baselines], groups, number of columns) of the report's contrasts."""
    n_model_columns = N_MODELS * N_SEEDS
    random_start = n_model_columns + len(FIXED)
    matched_start = random_start + n_random
    n_columns = matched_start + n_model_columns * n_matched
    model_rows, pair_rows, groups = [], [], []
    for m in range(N_MODELS):
        row = np.zeros(n_columns)
        row[m * N_SEEDS : (m + 1) * N_SEEDS] = 1.0 / N_SEEDS
        model_rows.append(row)
        group = []
        for baseline in range(len(FIXED)):
            pair = row.copy()
            pair[n_model_columns + baseline] -= 1.0
            group.append(len(pair_rows))
            pair_rows.append(pair)
        pair = row.copy()
        pair[random_start:matched_start] -= 1.0 / n_random
        group.append(len(pair_rows))
        pair_rows.append(pair)
        pair = row.copy()
        first = matched_start + m * N_SEEDS * n_matched
        pair[first : first + N_SEEDS * n_matched] -= 1.0 / (N_SEEDS * n_matched)
        group.append(len(pair_rows))
        pair_rows.append(pair)
        groups.append(group)
    return np.array(model_rows), np.array(pair_rows), groups, n_columns


def world(
    n: int,
    phi: float,
    n_columns: int,
    edge: float,
    rng: np.random.Generator,
    quiet: float = 1.0,
    n_matched: int = 0,
) -> np.ndarray:
    """[n, n_columns] daily returns: AR(1) with unit marginal std × 1%, seeds of a model correlated; model 0's
    seeds get mean ``edge`` (daily Sharpe units); the flat baseline is all zeros; below ``quiet`` = 1 the last
    model's seeds and their matched traders trade on that share of the days only (at least 2), 0 on the others."""
    burn = 50
    shocks = rng.normal(size=(n + burn, n_columns))
    common = rng.normal(size=(n + burn, N_MODELS))
    seeds = N_MODELS * N_SEEDS
    shocks[:, :seeds] = math.sqrt(1 - SEED_CORRELATION) * shocks[:, :seeds] + math.sqrt(
        SEED_CORRELATION
    ) * np.repeat(common, N_SEEDS, axis=1)
    shocks *= math.sqrt(1 - phi**2)
    x = np.empty_like(shocks)
    x[0] = shocks[0] / math.sqrt(1 - phi**2)
    for t in range(1, n + burn):
        x[t] = phi * x[t - 1] + shocks[t]
    x = x[burn:]
    x[:, :N_SEEDS] += edge
    x[:, seeds + 1] = 0.0  # flat
    if quiet < 1.0:
        off = np.ones(n, bool)
        off[rng.choice(n, max(2, round(quiet * n)), replace=False)] = False
        # the last model's seeds, and its seeds' `n_matched` matched traders each, which close the matrix
        columns = [*range(seeds - N_SEEDS, seeds), *range(n_columns - N_SEEDS * n_matched, n_columns)]
        x[np.ix_(off, columns)] = 0.0
    return x * 0.01


def one_world(
    k: int,
    n: int,
    phi: float,
    edge: float,
    boot: int,
    n_random: int,
    n_matched: int,
    seed: int,
    quiet: float = 1.0,
) -> tuple[bool, bool, bool, bool, float]:
    """(primary claim of any model, of model 0, secondary "better" any, "worse" any, the world's headline figure:
    the median over the models that trade of their detectable edge)."""
    model_rows, pair_rows, groups, n_columns = layout(n_random, n_matched)
    streams = [seed, n, int(100 * phi), int(1e6 * edge), k] + ([int(1000 * quiet)] if quiet < 1.0 else [])
    rng = np.random.default_rng(streams)
    x = world(n, phi, n_columns, edge, rng, quiet, n_matched)
    rules = VerdictRules(n_boot=boot, min_test_days=1, min_seeds=1)
    shares = [1.0] * (N_MODELS - 1) + [quiet]  # the report's trading share of each model
    eligible = [share >= rules.min_trading_share for share in shares]
    result = family_result(x, list(model_rows), list(pair_rows), groups, rules, seed=k, eligible=eligible)
    trading = result.detectable[np.array(eligible) & np.isfinite(result.detectable)]
    return (
        bool(result.primary.reject.any()),
        bool(result.primary.reject[0]),
        bool(result.better.any()),
        bool(result.worse.any()),
        float(np.median(trading)) if trading.size else math.nan,
    )


#: --quick: the smallest run that fills every column (each value where the option is left at its default)
QUICK = {
    "sims": 2,
    "boot": 50,
    "days": [20],
    "phis": [0.0],
    "random": 5,
    "matched": 2,
    "power_sims": 2,
    "quiet": [1.0, 0.1],
}


def rate(hits: int, worlds: int) -> str:
    """'r% [lo, hi]' with a 95% Clopper–Pearson interval."""
    lo = beta.ppf(0.025, hits, worlds - hits + 1) if hits else 0.0
    hi = beta.ppf(0.975, hits + 1, worlds - hits) if hits < worlds else 1.0
    return f"{100 * hits / worlds:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=300, help="worlds per cell (K)")
    parser.add_argument("--boot", type=int, default=400, help="bootstrap resamples per world")
    parser.add_argument("--days", type=int, nargs="+", default=[20, 60, 250])
    parser.add_argument("--phis", type=float, nargs="+", default=[0.0, 0.5])
    parser.add_argument(
        "--random", type=int, default=50, help="random traders (evaluation.random_baseline_seeds)"
    )
    parser.add_argument("--matched", type=int, default=50, help="turnover-matched traders per model seed")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--quiet",
        type=float,
        nargs="+",
        default=[1.0],
        help="layouts: share of days the last model trades (1 = every day; 0.1 = the quiet-model layout)",
    )
    parser.add_argument(
        "--power-sims", type=int, default=None, help="planted-edge worlds per cell (default K)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="K = 2 worlds at 20 days and phi 0, 50 resamples, 5 + 2 traders, both layouts: a sanity run, not a "
        "measurement",
    )
    args = parser.parse_args()
    if args.quick:  # an explicit value beats the mode's default
        for key, value in QUICK.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    print(
        f"bench/studies/verdict_size.py --sims {args.sims} --boot {args.boot} --random {args.random} "
        f"--matched {args.matched} --power-sims {args.power_sims}: {N_MODELS} models x {N_SEEDS} seeds, 5 baselines"
    )
    print(
        "\n| phi | test days | K | primary: false 'beats every baseline' | secondary: false 'better than X' "
        "| secondary: false 'worse than X' | median detectable (annualised) | one comparison (annualised) "
        "| power of the headline at the detectable edge | last model trades on |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    z = float(norm.ppf(0.95))
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for quiet, phi, n in ((q, p, d) for q in args.quiet for p in args.phis for d in args.days):
            job = partial(
                one_world,
                n=n,
                phi=phi,
                boot=args.boot,
                n_random=args.random,
                n_matched=args.matched,
                seed=23,
                quiet=quiet,
            )
            null = list(pool.map(partial(job, edge=0.0), range(args.sims)))
            detectable = float(np.nanmedian([w[4] for w in null]))
            power_sims = args.sims if args.power_sims is None else args.power_sims
            planted = list(pool.map(partial(job, edge=detectable), range(args.sims, args.sims + power_sims)))
            power = rate(sum(w[1] for w in planted), len(planted)) if planted else "–"
            one = minimum_detectable_sharpe_difference(n, z) * ANNUALIZER
            print(
                f"| {phi:g} | {n} | {args.sims} | {rate(sum(w[0] for w in null), len(null))} "
                f"| {rate(sum(w[2] for w in null), len(null))} | {rate(sum(w[3] for w in null), len(null))} "
                f"| {detectable * ANNUALIZER:.2f} | {one:.2f} | {power} | {100 * quiet:.0f}% of days |",
                flush=True,
            )


if __name__ == "__main__":
    main()
