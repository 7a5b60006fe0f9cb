"""The verdict's false-positive rate and power, end to end, on K synthetic worlds per arm (marketrl/calibration/worlds.py).

    PYTHONPATH=$PWD .venv/bin/python bench/studies/calibration.py --worlds 60 --processes 2 --out /tmp/calibration
    .venv/bin/python bench/studies/calibration.py --quick     # 1 tiny world per arm (2 arms), in a temp dir

An arm is (planted edge, its kind, pooled test days); every world of every arm runs the same pieces as the Snakemake target
`results/calibration/calibration.html`, from the config (config.yaml's `calibration` slice unless overridden here).
Worlds run round-robin over the arms (world 0 of every arm, then world 1, ...), each finished world is appended to
`<out>/worlds.jsonl`, so a run stopped early still has the same K in every arm (`--summarize-only` then writes the
summary of what finished). Prints the markdown tables of docs/PERFORMANCE.md ("Verdict calibration").
`--quick` runs one tiny world per arm (`QUICK`: ridge only, 4 test days, one fold; the test's tiny calibration) in
one process, into a temp dir unless `--out` is given: the machinery, not a rate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shlex
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

_CONFIG: dict[str, Any] = {}
#: --quick: the smallest worlds that still reach a verdict (tests/test_calibration.py's tiny calibration, ridge only)
QUICK = {
    "evaluation": {"min_test_days": 4, "min_seeds": 2, "bootstrap_samples": 100},
    "calibration": {
        "worlds": 1,
        "edges": [0, 10.0],
        "edge_kinds": ["reversion"],
        "test_days": [4],
        "folds": 1,
        "train_days": 3,
        "validation_days": 1,
        "models": ["linear"],
        "seeds": 2,
        "random_traders": 3,
    },
}


def _init_worker(config: dict[str, Any]) -> None:
    import torch

    torch.set_num_threads(1)
    _CONFIG.update(config)


def _run(spec: tuple[float, int, int, bool, str]) -> dict[str, Any]:
    from marketrl.calibration.worlds import CalibrationSettings, WorldSpec, run_world

    settings = CalibrationSettings.from_config(_CONFIG)
    return run_world(_CONFIG, settings, WorldSpec(*spec))


def _config(args: argparse.Namespace) -> dict[str, Any]:
    from marketrl.settings.config import validate_config

    raw = yaml.safe_load(Path(args.config).read_text(encoding="utf-8")) or {}
    if args.quick:
        for key, values in QUICK.items():
            raw[key] = {**(raw.get(key) or {}), **values}
    section = raw.setdefault("calibration", {})
    section["worlds"] = args.worlds
    for key in ("edges", "edge_kinds", "test_days", "models"):
        if getattr(args, key) is not None:
            section[key] = getattr(args, key)
    return validate_config(raw)


def _number(value: float | None, spec: str) -> str:
    """A table cell: the number, or a dash where it is undefined (every run flat: no variance, no figure)."""
    return "—" if value is None else format(value, spec)


def _tables(result: Mapping[str, Any]) -> str:
    summary = result["summary"]
    models = result["settings"]["models"]
    lines = [
        f"K = {result['settings']['worlds']} worlds per arm; command: `{result['command']}`",
        "",
        '| edge (oracle Sharpe) | kind | test days | worlds | "beats" rate [95% Clopper–Pearson] | worse | no claim | '
        + " | ".join(f"mean Sharpe {m}" for m in models)
        + " | mean formula detectable |",
        "|---|---|---|---|---|---|---|" + "---|" * len(models) + "---|",
    ]
    for arm in summary["arms"]:
        rate = arm["beats"]
        lines.append(
            f"| {arm['edge']:g} | {arm['kind']} | {arm['test_days']} | {arm['worlds']} | {100 * rate['rate']:.1f}% "
            f"[{100 * rate['ci'][0]:.1f}, {100 * rate['ci'][1]:.1f}] | {arm['outcomes']['worse']} | "
            f"{arm['outcomes']['none']} | "
            + " | ".join(_number(arm["mean_sharpe"][m], ".2f") for m in models)
            + f" | {_number(arm['mean_formula_detectable'], '.1f')} |"
        )
    fp = summary["false_positive"]
    if fp:
        lines += [
            "",
            f"False-positive rate (edge 0, all test-day counts): {100 * fp['rate']:.1f}% "
            f"[{100 * fp['ci'][0]:.1f}, {100 * fp['ci'][1]:.1f}] ({fp['k']}/{fp['n']}); target ≤ 5%.",
        ]
    lines += [
        "",
        "| edge | kind | test days | baseline | some model family-wise better [95% CI] | "
        + " | ".join(f"mean Sharpe diff {m}" for m in models)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(models),
    ]
    for arm in summary["arms"]:
        for name, rate in (arm["better_than"] or {}).items():
            lines.append(
                f"| {arm['edge']:g} | {arm['kind']} | {arm['test_days']} | {name} | {100 * rate['rate']:.1f}% "
                f"[{100 * rate['ci'][0]:.1f}, {100 * rate['ci'][1]:.1f}] | "
                + " | ".join(f"{rate['mean_diff'][m]:.2f}" for m in models)
                + " |"
            )
    lines += [
        "",
        "| kind | test days | edge at 80% power | Sharpe difference at 80% power |",
        "|---|---|---|---|",
    ]
    for row in summary["detectable"]:
        edge = "not reached" if row["edge_at_80_power"] is None else f"{row['edge_at_80_power']:.2f}"
        diff = (
            "-"
            if row["sharpe_difference_at_80_power"] is None
            else f"{row['sharpe_difference_at_80_power']:.2f}"
        )
        lines.append(f"| {row['kind']} | {row['test_days']} | {edge} | {diff} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--worlds", type=int, default=None, help="K per arm (default 60; quick 1)")
    parser.add_argument("--edges", type=float, nargs="+")
    parser.add_argument("--test-days", dest="test_days", type=int, nargs="+")
    parser.add_argument(
        "--edge-kinds", dest="edge_kinds", nargs="+", help="planted kinds (momentum, reversion)"
    )
    parser.add_argument("--models", nargs="+")
    parser.add_argument("--processes", type=int, default=None, help="default 2 (quick 1)")
    parser.add_argument("--out", default=None, help="default /tmp/calibration (quick: a temp dir)")
    parser.add_argument(
        "--summarize-only", action="store_true", help="summarize the finished worlds of --out"
    )
    parser.add_argument("--quick", action="store_true", help="1 tiny world per arm: a sanity run, not a rate")
    args = parser.parse_args()
    args.worlds = args.worlds or (1 if args.quick else 60)
    args.processes = args.processes or (1 if args.quick else 2)
    if args.out is None and args.quick:
        with tempfile.TemporaryDirectory(prefix="calibration-quick-") as tmp:
            args.out = tmp
            run(args)
        return
    args.out = args.out or "/tmp/calibration"
    run(args)


def run(args: argparse.Namespace) -> None:
    """Run the worlds still missing from `args.out`, then summarize and print the tables."""

    from marketrl.calibration.worlds import (
        CalibrationSettings,
        calibration_result,
        world_kind,
        world_specs,
        write_outputs,
    )

    config = _config(args)
    settings = CalibrationSettings.from_config(config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "worlds.jsonl"
    done = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
    finished = {(w["edge"], world_kind(w), w["test_days"], w["index"]) for w in done}
    specs = sorted(
        (s for s in world_specs(settings) if not s.per_fold),
        key=lambda s: (s.index, s.edge, s.kind, s.test_days),
    )
    todo = [
        (s.edge, s.test_days, s.index, s.per_fold, s.kind)
        for s in specs
        if (s.edge, s.kind, s.test_days, s.index) not in finished
    ]
    if not args.summarize_only and todo:
        with contextlib.ExitStack() as stack:
            log = stack.enter_context(log_path.open("a", encoding="utf-8"))
            if args.processes == 1:  # in this process: no second interpreter to start
                _init_worker(config)
                worlds = map(_run, todo)
            else:
                context = multiprocessing.get_context("spawn")
                pool = stack.enter_context(context.Pool(args.processes, _init_worker, (config,)))
                worlds = pool.imap(_run, todo)  # in order: the log stays round-robin over the arms
            for world in worlds:
                done.append(world)
                log.write(json.dumps(world) + "\n")
                log.flush()
                print(
                    f"{len(done)}/{len(specs)} edge {world['edge']:g} ({world_kind(world)}) "
                    f"days {world['test_days']}: "
                    f"{world['outcome']}",
                    flush=True,
                )
    # a run stopped early is summarized on the largest K for which every arm has worlds 0..K-1
    indices = {(s.edge, s.kind, s.test_days): set() for s in specs}
    for world in done:
        indices[(world["edge"], world_kind(world), world["test_days"])].add(world["index"])
    k = 0
    while all(k in members for members in indices.values()):
        k += 1
    if k == 0:
        sys.exit("calibration bench: some arm has no finished world yet")
    worlds = [w for w in done if w["index"] < k]
    config["calibration"]["worlds"] = k
    command = " ".join(["PYTHONPATH=$PWD", ".venv/bin/python", *map(shlex.quote, sys.argv)])
    result = calibration_result(worlds, config, command)
    write_outputs(result, out / "calibration.json", out / "calibration.html")
    print(_tables(result))


if __name__ == "__main__":
    os.environ.setdefault("POLARS_MAX_THREADS", "1")  # spawned workers inherit it: one core per world
    main()
