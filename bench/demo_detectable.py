"""The report's "could have detected" figure of a finished run, recomputed on its first N pooled test days.

    PYTHONPATH=$PWD .venv/bin/python bench/demo_detectable.py RUN_DIR --days 9 20 60

RUN_DIR is a checkout where `make run` finished (its results/ and config.yaml). For each N the report's own
`agent_verdicts` runs on the run's evaluation outputs with every series cut to the first N test days of the
pooled out-of-sample calendar (fold 0's first days first), the same bootstrap settings and root seed as the
report: the headline figure (the edge over every baseline the primary claim detects with 80% power) and the
analytic one-comparison figure beside it. That is how "the demo's figure at 9 days" is compared with a run whose
demo had 9 test days in all, without a second demo.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from marketrl.report import verdict
from marketrl.report.inputs import load_inputs
from marketrl.report.strategies import VerdictRules, build_strategies
from marketrl.report.tables import baseline_order
from marketrl.workflow.config import validate_config


def detectable_on_first_days(run_dir: Path, n_days: int | None) -> tuple[int, float, float, list[str]]:
    """(days used, headline detectable, one-comparison detectable, models that beat every baseline)."""
    results = run_dir / "results"
    evals = sorted(results.glob("eval/*/fold_*/seed_*/metrics.json")) + sorted(
        results.glob("eval/baselines/fold_*/metrics.json")
    )
    bars = [p.with_name("bars.parquet") for p in evals]
    inputs = load_inputs(evals, bars, [], results / "folds.json", [])
    config = validate_config(yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")))
    rules = VerdictRules.from_config(config)
    aligned = verdict._aligned_matrix

    def first_days(series):  # the report's own matrix, cut to its first n_days rows (days are sorted)
        days, matrix = aligned(series)
        return (days, matrix) if n_days is None else (days[:n_days], matrix[:n_days])

    verdict._aligned_matrix = first_days
    try:
        verdicts, family = verdict.agent_verdicts(
            inputs,
            build_strategies(inputs.agent_runs),
            baseline_order(build_strategies(inputs.baseline_runs)),
            build_strategies(inputs.random_seed_runs),
            rules,
            int(config["seed"]),
        )
    finally:
        verdict._aligned_matrix = aligned
    return (
        family.n_days,
        family.detectable,
        family.one_comparison_detectable,
        [v.algo for v in verdicts if v.beats],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--days", type=int, nargs="+", default=[9])
    args = parser.parse_args()
    print(
        "| test days | could have detected (headline, annualised) | one comparison | models that beat every baseline |"
    )
    print("|---|---|---|---|")
    for n in [*args.days, None]:
        used, headline, one, winners = detectable_on_first_days(args.run_dir, n)
        label = f"{used}" if n is not None else f"{used} (all)"
        print(f"| {label} | {headline:.2f} | {one:.2f} | {', '.join(winners) or 'none'} |", flush=True)


if __name__ == "__main__":
    main()
