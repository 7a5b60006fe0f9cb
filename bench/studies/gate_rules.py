"""Gate rules compared on finished runs (issue 35): which runs would trade, and what the model would net, under
other thresholds of the validation gate and the walk-forward record, without training anything again.

    .venv/bin/python bench/studies/gate_rules.py /tmp/sanity/noedge/seed_* --rules 1.0:- 1.5:1.0 1.0:1.0
    .venv/bin/python bench/studies/gate_rules.py /tmp/sanity/clear/seed_* --rules 1.5:1.0 --json out.json
    .venv/bin/python bench/studies/gate_rules.py --quick     # a synthetic run: a model that earns, one that churns

Each argument is a finished run's directory (one world x root seed of bench/studies/sanity.py, or any pipeline
run). Every model x fold x seed's metrics.json holds what the run would have made on its test days with no gate
(`ungated`: daily net and gross returns, turnover) and its train_log.json the validation gate's t-statistics
(`flat_gate.t_stat`, the run's own, and `flat_gate.pooled_t`, the seeds' mean portfolio's). A rule `V:R` lets a
run trade fold 0 when its validation t >= V (`pV:R`: every seed of fold 0 when the pooled t is), and every later
fold when the model's walk-forward record (the seeds' mean ungated daily net over the earlier folds' test days) has
t >= R (`V:R|P`: or else when the fold's pooled validation t >= P), as `marketrl.scoring.gate.record_gate` decides; `V:-` applies the validation gate on every fold (no
record). Per model it prints the mean over the runs (root seeds) of: the net Sharpe (annualised, pooled test
days, mean over the model's seeds, as the report's leaderboard has it), the cost drag (gross − net), the contracts
a day, and the smallest t-statistic of the seeds' mean daily net (a rough "worse than flat": the report's secondary family is
the real test). The pipeline's own figures (the report's) are those of the rule the run was made with.
`--quick` writes a synthetic run of three folds x two seeds (model `earner`: +5 bp a day net of costs, and
`churner`: −10 bp a day, each with one seed of fold 0 passing the validation gate at 1.5, the seeds pooled 2.0 and
0.5) to a temp dir and compares the rules on it; its numbers are no measurement.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from marketrl.scoring.gate import FoldRecord, record_gate  # noqa: E402

ANNUAL = math.sqrt(252)


def _sharpe(values: np.ndarray) -> float:
    sd = float(values.std(ddof=1)) if values.size > 1 else 0.0
    return float(values.mean() / sd * ANNUAL) if sd > 0 else 0.0


def _t(values: np.ndarray) -> float:
    sd = float(values.std(ddof=1)) if values.size > 1 else 0.0
    return float(values.mean() / sd * math.sqrt(values.size)) if sd > 0 else 0.0


def load_run(workdir: Path) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """model -> fold -> per seed: ungated daily net and gross returns, turnover and the validation t."""
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for metrics_path in sorted((workdir / "results" / "eval").glob("*/fold_*/seed_*/metrics.json")):
        model = metrics_path.parts[-4]
        if model == "baselines":
            continue
        metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
        if "ungated" not in metrics:
            raise SystemExit(
                f"{metrics_path}: no 'ungated' block (a run from before the walk-forward record)"
            )
        train_log = workdir / "results" / "models" / model / metrics_path.parts[-3] / metrics_path.parts[-2]
        gate = json.loads((train_log / "train_log.json").read_text(encoding="utf-8")).get("flat_gate") or {}
        t_stat, pooled_t = gate.get("t_stat"), gate.get("pooled_t")
        block = metrics["ungated"]
        runs.setdefault(model, {}).setdefault(int(metrics["fold"]), []).append(
            {
                "days": tuple(block["days"]),
                "net": np.asarray(block["daily_net_returns"], dtype=np.float64),
                "gross": np.asarray(block["daily_gross_returns"], dtype=np.float64),
                "turnover": float(block["avg_daily_turnover"]),
                "n_bars": int(block["n_bars"]),
                "validation_t": math.nan if t_stat is None else float(t_stat),
                "pooled_t": math.nan if pooled_t is None else float(pooled_t),
            }
        )
    return runs


def _fold_record(seeds: list[dict[str, Any]]) -> FoldRecord:
    return FoldRecord.of_seeds(
        seeds[0]["days"],
        [s["net"] for s in seeds],
        [s["gross"] for s in seeds],
        [s["turnover"] for s in seeds],
        seeds[0]["n_bars"],
    )


def trades(
    folds: dict[int, list[dict[str, Any]]],
    validation_t: float,
    record_t: float | None,
    pooled: bool = False,
    fallback_t: float | None = None,
) -> dict[int, list[bool]]:
    """Per fold, per seed: does the run trade under the rule (validation_t on fold 0, or every fold without a
    record threshold, on the run's own validation t or with `pooled` the seeds' pooled one; record_t on the later
    folds, or with `fallback_t` failing that the fold's pooled validation t >= fallback_t)?"""
    out: dict[int, list[bool]] = {}
    statistic = "pooled_t" if pooled else "validation_t"
    for fold in sorted(folds):
        if record_t is None or fold == min(folds):
            out[fold] = [bool(s[statistic] >= validation_t) for s in folds[fold]]
        else:
            record = [_fold_record(folds[earlier]) for earlier in sorted(folds) if earlier < fold]
            decision = record_gate(record, record_t)
            fallback = fallback_t is not None and folds[fold][0]["pooled_t"] >= fallback_t
            out[fold] = [not decision.set_flat or fallback] * len(folds[fold])
    return out


def model_figures(
    folds: dict[int, list[dict[str, Any]]], rule: tuple[float, float | None, bool, float | None]
) -> dict[str, float]:
    """One model of one run under a rule (`parse_rule`): net Sharpe, cost drag, turnover and the smallest
    seed-mean t."""
    decided = trades(folds, *rule)
    order = sorted(folds)
    n_seeds = len(folds[order[0]])
    nets, grosses, turnovers = [], [], []
    for seed in range(n_seeds):
        nets.append(np.concatenate([folds[k][seed]["net"] * decided[k][seed] for k in order]))
        grosses.append(np.concatenate([folds[k][seed]["gross"] * decided[k][seed] for k in order]))
        turnovers.append(np.mean([folds[k][seed]["turnover"] * decided[k][seed] for k in order]))
    net = float(np.mean([_sharpe(x) for x in nets]))
    gross = float(np.mean([_sharpe(x) for x in grosses]))
    return {
        "net": net,
        "drag": gross - net,
        "turnover": float(np.mean(turnovers)),
        "t": _t(np.mean(nets, axis=0)),
    }


def write_synthetic_run(workdir: Path) -> Path:
    """The --quick run: 3 folds x 2 seeds x 20 days of two models, as the evaluate and train jobs write them."""
    rng = np.random.default_rng(0)
    days = [f"2024-{1 + k:02d}-{d + 1:02d}" for k in range(3) for d in range(20)]
    for model, mean, validation_t, pooled_t in (
        ("earner", 5e-4, (0.5, 2.0), 2.0),
        ("churner", -1e-3, (1.2, 1.8), 0.5),
    ):
        for fold in range(3):
            for seed in range(2):
                net = rng.normal(mean, 2e-3, 20)
                block = {
                    "days": days[20 * fold : 20 * (fold + 1)],
                    "daily_net_returns": net.tolist(),
                    "daily_gross_returns": (net + 1e-3).tolist(),
                    "avg_daily_turnover": 20.0,
                    "n_bars": 400,
                }
                run = Path(model) / f"fold_{fold}" / f"seed_{seed}"
                metrics = workdir / "results" / "eval" / run / "metrics.json"
                metrics.parent.mkdir(parents=True, exist_ok=True)
                metrics.write_text(json.dumps({"fold": fold, "ungated": block}), encoding="utf-8")
                train_log = workdir / "results" / "models" / run / "train_log.json"
                train_log.parent.mkdir(parents=True, exist_ok=True)
                train_log.write_text(
                    json.dumps({"flat_gate": {"t_stat": validation_t[seed], "pooled_t": pooled_t}}),
                    encoding="utf-8",
                )
    return workdir


def parse_rule(text: str) -> tuple[float, float | None, bool, float | None]:
    """`V:R`, `V:-`, `pV:R` / `pV:-` (the validation gate on the seeds' pooled t, flat_gate.pooled_t), and
    `V:R|P` (a later fold whose record fails trades when its pooled validation t >= P)."""
    pooled = text.startswith("p")
    text, _, fallback = text.removeprefix("p").partition("|")
    validation, _, record = text.partition(":")
    return (
        float(validation),
        None if record in ("", "-") else float(record),
        pooled,
        float(fallback) if fallback else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "workdirs", nargs="*", type=Path, help="finished runs (one world, several root seeds)"
    )
    parser.add_argument("--quick", action="store_true", help="a synthetic run in a temp dir (no measurement)")
    parser.add_argument(
        "--rules",
        nargs="+",
        default=["1.0:-", "1.5:1.0", "p1.5:1.0"],
        help="V:R rules (V:- = no record; pV:R = the validation gate on the seeds' pooled t)",
    )
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    if args.quick:
        with tempfile.TemporaryDirectory(prefix="gate-rules-") as tmp:
            args.workdirs = [write_synthetic_run(Path(tmp))]
            return report(args)
    if not args.workdirs:
        parser.error("give finished run directories, or --quick")
    return report(args)


def report(args: argparse.Namespace) -> int:
    """Print (and with --json write) every model's figures under every rule."""
    runs = [load_run(workdir) for workdir in args.workdirs]
    models = sorted(set().union(*(run.keys() for run in runs)))
    table: dict[str, dict[str, dict[str, float]]] = {}
    for rule in args.rules:
        parsed = parse_rule(rule)
        for model in models:
            per_run = [model_figures(run[model], parsed) for run in runs if model in run]
            table.setdefault(rule, {})[model] = {
                "net": float(np.mean([f["net"] for f in per_run])),
                "drag": float(np.mean([f["drag"] for f in per_run])),
                "turnover": float(np.mean([f["turnover"] for f in per_run])),
                "worst_t": float(min(f["t"] for f in per_run)),
            }
    print(f"{len(runs)} runs: {', '.join(str(w) for w in args.workdirs)}")
    print("rule V:R -> per model: mean net Sharpe / mean cost drag / contracts a day / smallest seed-mean t")
    print("model".ljust(12) + "".join(f" | {rule:^27}" for rule in args.rules))
    for model in models:
        cells = [table[rule][model] for rule in args.rules]
        print(
            model.ljust(12)
            + "".join(
                f" | {c['net']:6.2f} {c['drag']:5.2f} {c['turnover']:6.1f} {c['worst_t']:5.1f}" for c in cells
            )
        )
    if args.json:
        args.json.write_text(json.dumps(table, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
