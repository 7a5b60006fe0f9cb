"""How the pipeline's cost grows with history (issue 39 item 4): the demo at several lengths, per stage.

    .venv/bin/python bench/speed/scale.py --days 72 250 500 --cores 2 --workdir /tmp/scale --json /tmp/scale.json
    .venv/bin/python bench/speed/scale.py --quick     # the tests' fast tiny config at 8 and 12 days, linear only

Each length N is one real Snakemake run of this checkout's workflow (the jobs `make run` runs) in its own
directory `<workdir>/days_<N>/`, whose config.yaml is the base config (this checkout's config.yaml; `--quick`:
tests/faults/pipeline.py `fast_tiny_config`) with `data.demo.days: N`, `training.models: --models` (default dqn,
linear, lightgbm) and as many folds of `folds.test_days` as the days hold after the tuning window
(`folds.n = min(20, (N - folds.tuning_days) // folds.test_days)`: 3 at 72 days, 11 at 250, 20 at 500). A finished
directory is kept and a rerun reuses it (then its wall and CPU are not re-measured: they come from the JSON of the
first run when `--json` names it).

Per length it prints the run's wall time and CPU (user + sys of Snakemake and every job, from the kernel's child
rusage), and per stage (the first folder of `results/benchmarks/`, Snakemake's `benchmark:` tables): job count,
summed job CPU-s, summed job wall-s, the largest job's peak RSS; then per stage the fitted growth exponent b of
CPU-s ~ N^b (least squares on the logs; 1 = linear in history), and the train stage's CPU per fold, last fold over
first (issue 39: flat within 1.5x). Checks (printed, PASS/FAIL): no job above `--max-job-mb` (4,096), the features
stage's wall within 1.5x of its CPU (the jobs' exact CPU from their logs' "job cost" lines: Snakemake's benchmark
samples CPU every 0.5 s and misses the end of a 1.5-second job), train CPU per fold within 1.5x. `--quick`'s numbers
are no measurement.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
if (
    str(ROOT) not in sys.path
):  # run as `python bench/speed/scale.py`: tests/ (--quick) is imported from the checkout
    sys.path.insert(0, str(ROOT))

DEFAULT_DAYS = (72, 250, 500)
QUICK_DAYS = (8, 12)
DEFAULT_MODELS = ("dqn", "linear", "lightgbm")
QUICK_MODELS = ("linear",)
MAX_FOLDS = 20
REPORT = "results/eval_report.html"
JOB_COST = re.compile(
    r"job cost: [\d.]+ s wall since the process started, ([\d.]+) CPU-s, peak RSS ([\d.]+) MB"
)


@dataclass
class StageCost:
    """One stage of one run, summed over its jobs' benchmark tables."""

    jobs: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    max_rss_mb: float = 0.0  # the larger of the benchmark's sampled peak and the jobs' logged one
    # the jobs' own exact CPU (their logs' "job cost" line, marketrl.runtime.jobs.job_cost): Snakemake's benchmark
    # samples CPU every 0.5 s and misses a short job's last fraction of a second
    logged_jobs: int = 0
    logged_cpu_s: float = 0.0

    def exact_cpu_s(self) -> float:
        """The jobs' logged CPU where every job logged it, else the benchmark's sampled CPU."""
        return self.logged_cpu_s if self.jobs and self.logged_jobs == self.jobs else self.cpu_s


@dataclass
class RunCost:
    """One length N: the run as a whole and per stage."""

    days: int
    folds: int
    wall_s: float
    cpu_s: float
    stages: dict[str, StageCost] = field(default_factory=dict)
    train_fold_cpu: dict[int, float] = field(default_factory=dict)  # train CPU-s per fold, over models


def run_config(base: Mapping[str, Any], days: int, models: Sequence[str]) -> dict[str, Any]:
    """The config.yaml of one length: base with the demo's days, the models and the folds that fit."""
    from tests.faults.pipeline import merged  # the tests' own recursive config merge

    folds = base["folds"]
    n_folds = min(MAX_FOLDS, (days - int(folds["tuning_days"])) // int(folds["test_days"]))
    if n_folds < 1:
        raise SystemExit(
            f"--days {days}: too few days for one fold after folds.tuning_days {folds['tuning_days']}"
        )
    overrides = {
        "data": {"source": "demo", "demo": {"days": days}},
        "folds": {"n": n_folds},
        "training": {"models": list(models)},
    }
    return merged(base, overrides)


def read_benchmarks(workdir: Path) -> tuple[dict[str, StageCost], dict[int, float]]:
    """Per stage (first folder of results/benchmarks/, or the file's stem) its summed job costs; train CPU per fold."""
    stages: dict[str, StageCost] = defaultdict(StageCost)
    per_fold: dict[int, float] = defaultdict(float)
    root = workdir / "results" / "benchmarks"
    for path in sorted(root.rglob("*.tsv")):
        relative = path.relative_to(root)
        stage = relative.parts[0] if len(relative.parts) > 1 else relative.stem
        with path.open(encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        if not rows:
            continue
        row = rows[-1]  # Snakemake appends a row per repeat; one repeat here
        cost = stages[stage]
        cost.jobs += 1
        cost.cpu_s += float(row["cpu_time"])
        cost.wall_s += float(row["s"])
        cost.max_rss_mb = max(
            cost.max_rss_mb, float(row["max_rss"]) if row["max_rss"] not in ("", "-") else 0.0
        )
        if stage == "train" and path.stem.startswith("fold_"):
            per_fold[int(path.stem.split("_")[1])] += float(row["cpu_time"])
        log = workdir / "results" / "logs" / relative.with_suffix(".log")
        cost = JOB_COST.search(log.read_text(encoding="utf-8", errors="replace")) if log.is_file() else None
        if cost is not None:
            stages[stage].logged_jobs += 1
            stages[stage].logged_cpu_s += float(cost[1])
            # the job's own peak: the benchmark's memory sampler can miss a job shorter than its first sample
            stages[stage].max_rss_mb = max(stages[stage].max_rss_mb, float(cost[2]))
    return dict(stages), dict(per_fold)


def run_length(workdir: Path, config: Mapping[str, Any], cores: int, known: Mapping[str, Any]) -> RunCost:
    """Run (or reuse) one length's pipeline and read its costs."""
    workdir.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(dict(config), sort_keys=True)
    config_path = workdir / "config.yaml"
    if not config_path.exists() or config_path.read_text(encoding="utf-8") != text:
        config_path.write_text(text, encoding="utf-8")
    done = (workdir / REPORT).exists()
    wall, cpu = float(known.get("wall_s", math.nan)), float(known.get("cpu_s", math.nan))
    command = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--cores", str(cores)]
    log = workdir / "snakemake.log"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with log.open("a", encoding="utf-8") as out:
        status = subprocess.run(
            [*command, "--rerun-incomplete", REPORT], cwd=workdir, stdout=out, stderr=subprocess.STDOUT
        ).returncode
    if status != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:])
        raise SystemExit(f"{workdir}: Snakemake exited {status} (log: {log}):\n{tail}")
    if not done:  # a fresh run: its own wall and CPU (a reused one keeps what was recorded)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.perf_counter() - started
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    stages, per_fold = read_benchmarks(workdir)
    return RunCost(
        int(config["data"]["demo"]["days"]), int(config["folds"]["n"]), wall, cpu, stages, per_fold
    )


def growth_exponent(days: Sequence[int], values: Sequence[float]) -> float:
    """b of values ~ days^b, least squares on the logs (NaN with fewer than two positive points)."""
    points = [(math.log(d), math.log(v)) for d, v in zip(days, values, strict=True) if v > 0]
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        return math.nan
    x, y = np.array(points).T
    return float(np.polyfit(x, y, 1)[0])


def fold_ratio(per_fold: Mapping[int, float]) -> float:
    """Train CPU of the last fold over the first (NaN without two folds)."""
    if len(per_fold) < 2 or per_fold[min(per_fold)] <= 0:
        return math.nan
    return per_fold[max(per_fold)] / per_fold[min(per_fold)]


def tables(runs: Sequence[RunCost], max_job_mb: float) -> tuple[str, list[dict[str, Any]]]:
    """The markdown tables and the checks."""
    lines = [
        "| days | folds | wall | CPU (user + sys) | jobs | largest job's peak RSS |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        jobs = sum(s.jobs for s in run.stages.values())
        peak = max((s.max_rss_mb for s in run.stages.values()), default=0.0)
        lines.append(
            f"| {run.days} | {run.folds} | {run.wall_s:.0f} s | {run.cpu_s:.0f} s | {jobs} | {peak:,.0f} MB |"
        )
    stage_names = sorted({name for run in runs for name in run.stages})
    lines += [
        "",
        "| stage | "
        + " | ".join(f"{r.days} d: jobs, CPU-s, wall-s, peak MB" for r in runs)
        + " | growth b |",
    ]
    lines.append("|---|" + "---|" * (len(runs) + 1))
    for name in stage_names:
        cells = []
        for run in runs:
            s = run.stages.get(name, StageCost())
            cells.append(f"{s.jobs}, {s.cpu_s:.0f}, {s.wall_s:.0f}, {s.max_rss_mb:,.0f}")
        b = growth_exponent([r.days for r in runs], [r.stages.get(name, StageCost()).cpu_s for r in runs])
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {b:.2f} |")
    checks = []
    for run in runs:
        peak = max((s.max_rss_mb for s in run.stages.values()), default=0.0)
        features = run.stages.get("features", StageCost())
        ratio = fold_ratio(run.train_fold_cpu)
        features_cpu = features.exact_cpu_s()
        features_ratio = features.wall_s / features_cpu if features_cpu > 0 else math.nan
        checks += [
            {
                "days": run.days,
                "check": f"no job above {max_job_mb:,.0f} MB",
                "value": peak,
                "ok": peak <= max_job_mb,
            },
            {
                "days": run.days,
                "check": "features wall within 1.5x of its CPU",
                "value": features_ratio,
                "ok": bool(features_ratio <= 1.5) if math.isfinite(features_ratio) else None,
            },
            {
                "days": run.days,
                "check": "train CPU per fold, last over first, within 1.5x",
                "value": ratio,
                "ok": bool(ratio <= 1.5) if math.isfinite(ratio) else None,
            },
        ]
    lines += ["", "| days | check | value | result |", "|---|---|---|---|"]
    for c in checks:
        result = "n/a" if c["ok"] is None else ("PASS" if c["ok"] else "FAIL")
        lines.append(f"| {c['days']} | {c['check']} | {c['value']:.2f} | {result} |")
    return "\n".join(lines), checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, nargs="+", default=None, help="demo lengths (default 72 250 500)")
    parser.add_argument(
        "--models", nargs="+", default=None, help="training.models (default dqn linear lightgbm)"
    )
    parser.add_argument("--cores", type=int, default=2, help="snakemake --cores")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where the runs live (kept; default a temp dir)"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write the figures here (and reuse its walls)"
    )
    parser.add_argument("--max-job-mb", type=float, default=4096.0, help="the per-job memory cap checked")
    parser.add_argument(
        "--quick", action="store_true", help="the tests' tiny config at 8 and 12 days: a sanity run"
    )
    args = parser.parse_args()
    if args.quick:
        from tests.faults.pipeline import fast_tiny_config

        base = fast_tiny_config()
    else:
        base = yaml.safe_load((ROOT / "config.yaml").read_text(encoding="utf-8"))
    days = args.days or list(QUICK_DAYS if args.quick else DEFAULT_DAYS)
    models = args.models or list(QUICK_MODELS if args.quick else DEFAULT_MODELS)
    known: dict[int, dict[str, Any]] = {}
    if args.json and args.json.exists():
        known = {int(r["days"]): r for r in json.loads(args.json.read_text(encoding="utf-8"))["runs"]}
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        workdir = args.workdir or Path(tmp)
        runs = []
        for n in days:
            runs.append(
                run_length(workdir / f"days_{n}", run_config(base, n, models), args.cores, known.get(n, {}))
            )
            print(f"{n} days: {runs[-1].wall_s:.0f} s wall, {runs[-1].cpu_s:.0f} CPU-s", flush=True)
        text, checks = tables(runs, args.max_job_mb)
    print(text)
    if args.json:
        record = {"models": models, "cores": args.cores, "runs": [asdict(r) for r in runs], "checks": checks}
        args.json.write_text(json.dumps(record, indent=2, default=float), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
