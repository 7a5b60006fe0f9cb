"""The report's "could have detected" figure of a finished run, recomputed on its first N pooled test days.

    .venv/bin/python bench/studies/demo_detectable.py RUN_DIR --days 9 20 60
    .venv/bin/python bench/studies/demo_detectable.py --quick     # a synthetic run (tests/report_fixtures.py), N = 3

RUN_DIR is a checkout where `make run` finished (its results/ and config.yaml). For each N the report's own
`model_verdicts` runs on the run's evaluation outputs with every series cut to the first N test days of the
pooled out-of-sample calendar (fold 0's first days first), the same bootstrap settings and root seed as the
report: the headline figure (the edge over every baseline the primary claim detects with 80% power) and the
analytic one-comparison figure beside it. That is how "the demo's figure at 9 days" is compared with a run whose
demo had 9 test days in all, without a second demo. `--quick` writes a synthetic finished run instead (the report
tests' outputs, tests/report_fixtures.py: 2 models x 2 seeds, 2 folds of 3 test days) and checks the script runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# run as `python bench/studies/demo_detectable.py`: sys.path holds bench/studies/, not the checkout (tests/)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from marketrl.report.tables import baseline_order  # noqa: E402
from marketrl.settings.config import validate_config  # noqa: E402
from marketrl.verdict import verdicts as verdict  # noqa: E402
from marketrl.verdict.inputs import load_inputs  # noqa: E402
from marketrl.verdict.strategies import VerdictRules, build_strategies, random_seed_strategies  # noqa: E402


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
        verdicts, family = verdict.model_verdicts(
            inputs,
            build_strategies(inputs.model_runs),
            baseline_order(build_strategies(inputs.baseline_runs)),
            random_seed_strategies(inputs),
            rules,
            int(config["seed"]),
        )
    finally:
        verdict._aligned_matrix = aligned
    return (
        family.n_days,
        family.detectable,
        family.one_comparison_detectable,
        [v.model for v in verdicts if v.beats],
    )


def synthetic_run(root: Path) -> Path:
    """A finished run's results/ and config.yaml under `root`, synthetic (tests/report_fixtures.py)."""
    from tests.report_fixtures import write_pipeline_outputs

    outputs = write_pipeline_outputs(root, n_folds=2, n_seeds=2, test_days=3, bootstrap_samples=100)
    (root / "config.yaml").write_text(yaml.safe_dump(outputs.config), encoding="utf-8")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, nargs="?", help="a finished run (not with --quick)")
    parser.add_argument(
        "--days", type=int, nargs="+", default=None, help="the values of N (default 9; quick 3)"
    )
    parser.add_argument("--quick", action="store_true", help="a synthetic finished run instead: a sanity run")
    args = parser.parse_args()
    if (args.run_dir is None) != args.quick:
        parser.error("give RUN_DIR or --quick")
    args.days = args.days or ([3] if args.quick else [9])
    with tempfile.TemporaryDirectory(prefix="demo-detectable-") as tmp:
        table(synthetic_run(Path(tmp)) if args.quick else args.run_dir, args.days)


def table(run_dir: Path, days: list[int]) -> None:
    """Print the markdown table: one row per N, then all the run's test days."""
    print(
        "| test days | could have detected (headline, annualised) | one comparison | models that beat every baseline |"
    )
    print("|---|---|---|---|")
    for n in [*days, None]:
        used, headline, one, winners = detectable_on_first_days(run_dir, n)
        label = f"{used}" if n is not None else f"{used} (all)"
        print(f"| {label} | {headline:.2f} | {one:.2f} | {', '.join(winners) or 'none'} |", flush=True)


if __name__ == "__main__":
    main()
