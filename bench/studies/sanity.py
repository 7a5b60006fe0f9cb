"""Sanity bench (issue 35): the whole pipeline on three demo worlds x three root seeds, against the issue's targets.

    .venv/bin/python bench/studies/sanity.py --cores 2 --workdir /tmp/sanity --json /tmp/sanity.json
    .venv/bin/python bench/studies/sanity.py --quick     # tiny pipeline, one world, one seed, linear + dqn

Each world x root seed is one real Snakemake run of this checkout's workflow (the jobs `make run` runs: demo data,
features, folds, hyperopt, train, evaluate, report) in its own directory `<workdir>/<world>/seed_<seed>/`, whose
config.yaml is the base config (`--config`, default this checkout's config.yaml: the full demo) with `seed`, the
world's `data.demo` keys and `--models` (training.models) overridden. A finished directory is kept: a rerun of the
same command reuses it (Snakemake reruns only what is missing or changed). Worlds:

- `noedge`: the default demo (data.demo.edge: 0);
- `weak`: data.demo.edge: 3, data.demo.edge_kind: reversion;
- `clear`: data.demo.edge: 10, data.demo.edge_kind: reversion.

Per world, model and root seed it prints what the report computes from that run's outputs (the report's own
`model_verdicts` and leaderboard, recomputed with the run's config and root seed and checked against its
results/verdict.json): the net Sharpe (annualised, pooled over the test days, mean over the model's seeds), the
gross one, the cost drag (gross − net), the average daily turnover (contracts per instrument and day) and whether
the verdict's secondary family finds the model significantly worse than flat; then the means over the root seeds.
The oracle is the demo's own (docs/DEMO_DATA.md): it holds sign · sign(ret_L) in each instrument (momentum: L = 15,
+1; reversion: L = 5, −1), one contract, filled at the close; its realised net Sharpe is scored here on the same test
rows, env and costs as the baselines, pooled over the test days like the report's (the planted `edge` is the
oracle's expected Sharpe, not its realised one on these days). The targets (issue 35), PASS/FAIL each:

- noedge: every model's mean cost drag <= 1.0, and no model significantly worse than flat on any root seed;
- weak: no model significantly worse than flat on any root seed;
- clear: every model's mean net Sharpe >= 50% of the oracle's mean realised net Sharpe.

A "worse than flat" target is n/a where some run made no claim (fewer test days or seeds than
evaluation.min_test_days / min_seeds). `--quick`: the same code path on the tests' fast tiny config
(tests/faults/pipeline.py `fast_tiny_config`: 6 demo days, one fold of 2 test days, one seed), the world `clear`,
one root seed, linear and dqn, in a temp dir unless `--workdir`; its numbers are no measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
# run as `python bench/studies/sanity.py`: sys.path holds bench/studies/, not the checkout (tests/, --quick)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: The worlds: their data.demo overrides and planted edge (the oracle's expected net Sharpe).
WORLDS: dict[str, dict[str, Any]] = {
    "noedge": {"edge": 0},
    "weak": {"edge": 3, "edge_kind": "reversion"},
    "clear": {"edge": 10, "edge_kind": "reversion"},
}
DEFAULT_SEEDS = (20240102, 1, 7)
QUICK_MODELS = ("linear", "dqn")
MAX_COST_DRAG = 1.0  # noedge: every model's mean cost drag at most this
MIN_ORACLE_SHARE = 0.5  # clear: every model's mean net Sharpe at least this share of the oracle's
REPORT = "results/eval_report.html"
#: Written before a run starts and removed when Snakemake returns: found at the start, the last run was killed.
RUNNING = "sanity-running"


@dataclass
class ModelResult:
    """One model of one run, as the report computes it."""

    net_sharpe: float
    gross_sharpe: float
    cost_drag: float
    turnover: float
    below_flat: bool | None  # None: the verdict made no claim (not enough test days or seeds)
    beats_every_baseline: bool


@dataclass
class RunResult:
    """One world x root seed: its directory, the oracle's realised net Sharpe and every model's figures."""

    world: str
    seed: int
    workdir: str
    wall_s: float
    oracle_sharpe: float
    test_days: int
    models: dict[str, ModelResult] = field(default_factory=dict)
    error: str = ""


# ------------------------------------------------------------------------------------------------------ configs


def base_config(args: argparse.Namespace) -> dict[str, Any]:
    """The config every run starts from: --config, or with --quick the tests' fast tiny config."""
    if args.quick:
        from tests.faults.pipeline import fast_tiny_config

        return fast_tiny_config()
    return yaml.safe_load(Path(args.config).read_text(encoding="utf-8")) or {}


def run_config(
    base: Mapping[str, Any], world: str, seed: int, models: Sequence[str] | None
) -> dict[str, Any]:
    """The config.yaml of one world x root seed."""
    overrides: dict[str, Any] = {"seed": seed, "data": {"source": "demo", "demo": dict(WORLDS[world])}}
    if models:
        overrides["training"] = {"models": list(models)}
    from tests.faults.pipeline import merged  # the tests' own recursive config merge

    return merged(base, overrides)


def prepare_workdir(workdir: Path, config: Mapping[str, Any]) -> Path:
    """`workdir` holding `config` as config.yaml; an unchanged config.yaml is left as it is (a rerun resumes)."""
    workdir.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(dict(config), sort_keys=True)
    path = workdir / "config.yaml"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return workdir


# ------------------------------------------------------------------------------------------------- the pipeline


def _snakemake(workdir: Path, log: Path, *args: str) -> int:
    """Run this checkout's workflow in `workdir` (Snakemake's output appended to `log`); its exit status."""
    command = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), *args]
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        return subprocess.run(command, cwd=workdir, stdout=out, stderr=subprocess.STDOUT).returncode


def run_pipeline(workdir: Path, cores: int) -> tuple[float, str]:
    """The report target of the workflow in `workdir`, resumed if a run was there before; (wall s, error)."""
    log = workdir / "snakemake.log"
    marker = workdir / RUNNING
    if marker.exists():  # the last run of this script here was killed: its lock is stale
        _snakemake(workdir, log, "--unlock")
    marker.touch()
    started = time.perf_counter()
    status = _snakemake(workdir, log, "--cores", str(cores), "--rerun-incomplete", REPORT)
    wall = time.perf_counter() - started
    marker.unlink()
    if status == 0:
        return wall, ""
    tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
    return wall, f"Snakemake exited {status} (log: {log}):\n" + "\n".join(tail)


# ------------------------------------------------------------------------------------------------- the analysis


@contextlib.contextmanager
def _inside(path: Path) -> Iterator[None]:
    """Work in `path` (the run's results/ paths are relative to it), then return."""
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _finite(value: Any) -> float:
    return float(value) if value is not None and math.isfinite(float(value)) else math.nan


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def report_figures(config: Mapping[str, Any]) -> tuple[dict[str, ModelResult], int]:
    """Every model's figures from the finished run in the current directory, computed as the report computes them
    (its verdict and leaderboard, the run's config and root seed), checked against its results/verdict.json;
    and the number of pooled test days."""
    from marketrl.report import tables
    from marketrl.settings import paths
    from marketrl.verdict.inputs import load_inputs
    from marketrl.verdict.strategies import VerdictRules, build_strategies, random_seed_strategies
    from marketrl.verdict.verdicts import model_verdicts
    from marketrl.workflow import pipeline

    inputs = load_inputs(
        pipeline.eval_files(dict(config)),
        pipeline.eval_bar_files(dict(config)),
        pipeline.hyperopt_files(dict(config)),
        paths.FOLDS,
        pipeline.train_log_files(dict(config)),
    )
    agents = build_strategies(inputs.model_runs)
    baselines = tables.baseline_order(build_strategies(inputs.baseline_runs))
    random_seeds = random_seed_strategies(inputs)  # streamed one trader at a time, as the report does
    rules = VerdictRules.from_config(config)
    verdicts, family = model_verdicts(inputs, agents, baselines, random_seeds, rules, int(config["seed"]))
    board = {
        row.name: row for row in tables.leaderboard(inputs, verdicts, agents, baselines, random_seeds, {}, {})
    }
    recorded = json.loads(Path(paths.VERDICT).read_text(encoding="utf-8"))["models"]
    figures = {}
    for verdict in verdicts:
        mine = recorded[verdict.model]
        if mine["beats_every_baseline"] != verdict.beats or not _same(
            _finite(mine["sharpe"]["point"]), _finite(verdict.sharpe.point)
        ):
            raise RuntimeError(f"{verdict.model}: the recomputed verdict differs from {paths.VERDICT}")
        flat = next((c for c in verdict.comparisons if c.baseline == "flat"), None)
        if flat is None:
            raise RuntimeError(f"{verdict.model}: the verdict has no comparison with the flat baseline")
        row = board[verdict.model]
        figures[verdict.model] = ModelResult(
            net_sharpe=_finite(row.sharpe.point),
            gross_sharpe=_finite(row.gross_sharpe),
            cost_drag=_finite(row.cost_drag),
            turnover=_finite(row.turnover),
            below_flat=flat.worse if verdict.enough_data else None,
            beats_every_baseline=verdict.beats,
        )
    return figures, family.n_days


def oracle_sharpe(config: Mapping[str, Any]) -> float:
    """The demo oracle's realised net Sharpe (annualised) on the run's test days, pooled over its folds as the
    report pools a baseline: sign · sign(ret_L) per instrument (the world's edge kind), the baselines' test rows,
    env and costs (the run in the current directory)."""
    import polars as pl
    import torch

    from marketrl.data.demo import EDGE_KINDS
    from marketrl.env import evaluate_positions
    from marketrl.settings import paths
    from marketrl.splits.datasets import env_config_from_config, fold_window, load_features_for_days
    from marketrl.splits.folds import FoldPlan
    from marketrl.verdict.strategies import ReturnSeries, annualized_sharpe

    lookback, sign = EDGE_KINDS[config["data"]["demo"].get("edge_kind", "momentum")]
    plan = FoldPlan.load(paths.FOLDS)
    env_config = env_config_from_config(config)
    bars = []
    for fold in range(config["folds"]["n"]):
        spec = plan.fold(fold)
        table = load_features_for_days(paths.FEATURE_MANIFEST, (*spec.inner_train_days, *spec.test_days))
        window = fold_window(table, plan, fold, config, "cpu", splits=("test",))
        data = window.splits["test"]
        assert data.rows is not None
        # the raw (not normalized) signal of each row, in MarketData's row order (its series order)
        signal = data.rows.join(
            window.frames["test"].select("instrument_id", "ts_event", f"ret_{lookback}"),
            on=["instrument_id", "ts_event"],
            how="left",
            maintain_order="left",
        )[f"ret_{lookback}"]
        positions = sign * np.sign(signal.fill_null(0.0).fill_nan(0.0).to_numpy())
        bars.append(evaluate_positions(data, torch.as_tensor(positions, dtype=torch.float32), env_config))
    pooled = ReturnSeries.from_bars(pl.concat(bars, how="vertical_relaxed"))
    return annualized_sharpe(pooled.daily()[1])


def analyse(world: str, seed: int, workdir: Path, wall: float) -> RunResult:
    """The figures of one finished run."""
    from marketrl.settings.config import validate_config

    with _inside(workdir):
        config = validate_config(yaml.safe_load(Path("config.yaml").read_text(encoding="utf-8")))
        figures, n_days = report_figures(config)
        oracle = oracle_sharpe(config)
    return RunResult(world, seed, str(workdir), wall, oracle, n_days, figures)


# ------------------------------------------------------------------------------------------------ the summaries


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def _num(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "-"


def _flag(value: bool | None) -> str:
    return "no claim" if value is None else ("YES" if value else "no")


def world_means(runs: Sequence[RunResult]) -> dict[str, Any]:
    """The means over the root seeds of one world: the oracle and, per model, every figure."""
    done = [r for r in runs if not r.error]
    models = list(dict.fromkeys(m for r in done for m in r.models))
    oracle = _mean([r.oracle_sharpe for r in done])
    means: dict[str, Any] = {"oracle_sharpe": oracle, "models": {}}
    for model in models:
        rows = [r.models[model] for r in done if model in r.models]
        net = _mean([m.net_sharpe for m in rows])
        claims = [m.below_flat for m in rows]
        means["models"][model] = {
            "net_sharpe": net,
            "gross_sharpe": _mean([m.gross_sharpe for m in rows]),
            "cost_drag": _mean([m.cost_drag for m in rows]),
            "turnover": _mean([m.turnover for m in rows]),
            "below_flat_seeds": sum(1 for c in claims if c),
            "no_claim_seeds": sum(1 for c in claims if c is None),
            "oracle_share": net / oracle if math.isfinite(oracle) and oracle > 0 else math.nan,
        }
    return means


def world_table(world: str, runs: Sequence[RunResult], means: Mapping[str, Any]) -> str:
    """The markdown table of one world: a row per model and root seed, then the model's mean row."""
    from marketrl.data.demo import EDGE_KINDS

    edge = WORLDS[world]
    lookback, direction = EDGE_KINDS[edge.get("edge_kind", "momentum")]
    sign = "" if direction > 0 else "−"
    lines = [
        f"### {world}: data.demo.edge {edge['edge']}"
        + (f", edge_kind {edge['edge_kind']}" if "edge_kind" in edge else " (the default demo)"),
        "",
        f"oracle ({sign}sign(ret_{lookback}) per instrument, realised net Sharpe on the pooled test days): "
        + ", ".join(f"seed {r.seed}: {_num(r.oracle_sharpe)}" for r in runs if not r.error)
        + f"; mean {_num(means['oracle_sharpe'])} (planted edge, its expected Sharpe: {edge['edge']})",
        "",
        "| model | root seed | net Sharpe | gross Sharpe | cost drag | turnover (contracts/day) "
        "| significantly below flat | beats every baseline | net / oracle |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model, mean in means["models"].items():
        for run in runs:
            if run.error or model not in run.models:
                continue
            m = run.models[model]
            share = m.net_sharpe / run.oracle_sharpe if WORLDS[world]["edge"] > 0 else math.nan
            lines.append(
                f"| {model} | {run.seed} | {_num(m.net_sharpe)} | {_num(m.gross_sharpe)} | {_num(m.cost_drag)} "
                f"| {_num(m.turnover, 1)} | {_flag(m.below_flat)} | {'yes' if m.beats_every_baseline else 'no'} "
                f"| {_num(share)} |"
            )
        n = sum(1 for r in runs if not r.error and model in r.models)
        share = mean["oracle_share"] if WORLDS[world]["edge"] > 0 else math.nan
        below = f"{mean['below_flat_seeds']}/{n} seeds" + (
            f" ({mean['no_claim_seeds']} no claim)" if mean["no_claim_seeds"] else ""
        )
        lines.append(
            f"| **{model}** | mean | **{_num(mean['net_sharpe'])}** | {_num(mean['gross_sharpe'])} "
            f"| **{_num(mean['cost_drag'])}** | {_num(mean['turnover'], 1)} | {below} | | {_num(share)} |"
        )
    for run in runs:
        if run.error:
            lines.append(f"\nseed {run.seed}: FAILED, {run.error.splitlines()[0]}")
    return "\n".join(lines)


def _below_flat_target(world: str, means: Mapping[str, Any]) -> dict[str, Any]:
    models = means["models"]
    worse = [m for m, v in models.items() if v["below_flat_seeds"]]
    unclaimed = [m for m, v in models.items() if v["no_claim_seeds"]]
    if worse:
        result, value = (
            "FAIL",
            "below flat: " + ", ".join(f"{m} ({models[m]['below_flat_seeds']})" for m in worse),
        )
    elif unclaimed:
        result, value = "n/a", "no claim made for " + ", ".join(unclaimed)
    else:
        result, value = "PASS", "none below flat"
    return {
        "world": world,
        "target": "no model significantly worse than flat on any root seed",
        "value": value,
        "result": result,
    }


def targets(summary: Mapping[str, Mapping[str, Any]], complete: Mapping[str, bool]) -> list[dict[str, Any]]:
    """The issue's targets of the worlds that ran, each with its value and PASS / FAIL (n/a: not testable)."""
    rows = []
    for world, means in summary.items():
        models = means["models"]
        if not models:
            continue
        if world == "noedge":
            worst = max(models, key=lambda m: _finite(models[m]["cost_drag"]))
            drag = models[worst]["cost_drag"]
            ok = all(
                math.isfinite(v["cost_drag"]) and v["cost_drag"] <= MAX_COST_DRAG for v in models.values()
            )
            rows.append(
                {
                    "world": world,
                    "target": f"every model's mean cost drag <= {MAX_COST_DRAG:g}",
                    "value": f"largest: {worst} {_num(drag)}",
                    "result": "PASS" if ok else "FAIL",
                }
            )
        if world in ("noedge", "weak"):
            rows.append(_below_flat_target(world, means))
        if world == "clear":
            shares = {m: v["oracle_share"] for m, v in models.items()}
            worst = min(shares, key=lambda m: shares[m] if math.isfinite(shares[m]) else -math.inf)
            if not math.isfinite(means["oracle_sharpe"]) or means["oracle_sharpe"] <= 0:
                result = "n/a"
            else:
                result = "PASS" if all(s >= MIN_ORACLE_SHARE for s in shares.values()) else "FAIL"
            rows.append(
                {
                    "world": world,
                    "target": f"every model's mean net Sharpe >= {100 * MIN_ORACLE_SHARE:g}% of the oracle's",
                    "value": f"smallest: {worst} {_num(shares[worst])} of {_num(means['oracle_sharpe'])}",
                    "result": result,
                }
            )
    for row in rows:
        if not complete[row["world"]] and row["result"] == "PASS":
            row["result"] = "PASS (incomplete)"
    return rows


def targets_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The targets as a markdown table."""
    lines = ["### targets (issue 35)", "", "| world | target | value | result |", "|---|---|---|---|"]
    lines += [f"| {r['world']} | {r['target']} | {r['value']} | {r['result']} |" for r in rows]
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------------- main


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def run(args: argparse.Namespace) -> int:
    """Run (or resume) every world x root seed, then print the tables and the targets; 1 if a run failed."""
    base = base_config(args)
    workdir = Path(args.workdir)
    results: dict[str, list[RunResult]] = {}
    for world in args.worlds:
        for seed in args.seeds:
            directory = prepare_workdir(
                workdir / world / f"seed_{seed}", run_config(base, world, seed, args.models)
            )
            print(f"{world} seed {seed}: running the pipeline in {directory} ...", flush=True)
            wall, error = run_pipeline(directory, args.cores)
            if not error:
                try:
                    result = analyse(world, seed, directory, wall)
                except Exception as exc:  # a finished run whose outputs cannot be read: report it, go on
                    result = RunResult(world, seed, str(directory), wall, math.nan, 0, error=repr(exc))
            else:
                result = RunResult(world, seed, str(directory), wall, math.nan, 0, error=error)
            print(
                f"{world} seed {seed}: {'FAILED' if result.error else 'done'} in {wall:.0f} s"
                + (f"\n{result.error}" if result.error else ""),
                flush=True,
            )
            results.setdefault(world, []).append(result)
    summary = {world: world_means(runs) for world, runs in results.items()}
    complete = {world: not any(r.error for r in runs) for world, runs in results.items()}
    rows = targets(summary, complete)
    print()
    print(f"root seeds {' '.join(map(str, args.seeds))}; command: {' '.join(sys.argv)}")
    print(
        "net Sharpe: annualised, pooled over the test days, mean over the model's seeds (the report's); cost drag: "
        "gross − net Sharpe; turnover: average daily turnover, contracts per instrument and day; "
        "below flat: the verdict's per-baseline family (5%)"
    )
    for world, runs in results.items():
        print()
        print(world_table(world, runs, summary[world]))
    print()
    print(targets_table(rows))
    if args.json:
        record = {
            "args": {k: v for k, v in vars(args).items()},
            "worlds": {world: WORLDS[world] for world in results},
            "runs": [asdict(r) for runs in results.values() for r in runs],
            "means": summary,
            "targets": rows,
        }
        Path(args.json).write_text(json.dumps(_json_safe(record), indent=2) + "\n", encoding="utf-8")
    return 1 if not all(complete.values()) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "config.yaml"), help="base config (default: the demo)")
    parser.add_argument(
        "--seeds", type=int, nargs="+", help=f"root seeds (default {DEFAULT_SEEDS}; quick: the first)"
    )
    parser.add_argument("--worlds", nargs="+", choices=list(WORLDS), help="default all three (quick: clear)")
    parser.add_argument(
        "--models", nargs="+", help=f"training.models (default the config's; quick {QUICK_MODELS})"
    )
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="Snakemake --cores per run")
    parser.add_argument(
        "--workdir", help="scratch dir, one subdir per world x seed (default /tmp/sanity; quick: temp)"
    )
    parser.add_argument("--json", help="write every number here")
    parser.add_argument(
        "--quick", action="store_true", help="tiny pipeline, one world and seed: a check, no figure"
    )
    args = parser.parse_args()
    if args.cores < 1:
        parser.error(f"--cores: expected an integer >= 1, got {args.cores}")
    args.seeds = args.seeds or list(DEFAULT_SEEDS[:1] if args.quick else DEFAULT_SEEDS)
    args.worlds = args.worlds or (["clear"] if args.quick else list(WORLDS))
    if args.quick and not args.models:
        args.models = list(QUICK_MODELS)
    if args.workdir is None and args.quick:
        with tempfile.TemporaryDirectory(prefix="sanity-quick-") as tmp:
            args.workdir = tmp
            return run(args)
    args.workdir = args.workdir or "/tmp/sanity"
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
