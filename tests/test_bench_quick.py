"""Every bench/ script runs to the end in its --quick mode (small sizes, seconds), and the equal-work checks each
makes before timing pass: a broken bench fails `make test`. Never asserts a speed or a rate.

One test per script of bench/speed/ and bench/studies/ (bench/README.md lists them); bench/gpu/gpu_check.py's
--quick (= --dry) is tests/test_gpu_check.py, bench/speed/hyperopt_scale.py's needs PostgreSQL and is
tests/postgres/test_bench_hyperopt_scale.py. No test imports bench/ code: what the scripts share with the tests is
in tests/support/.

The runs that need no fixture start together when the first of them is needed, two at a time in the background
(`quick`), so that the module takes about half its CPU time on two cores; each test then waits for its own.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import polars as pl
import pytest

from marketrl.features import CATALOG
from marketrl.models import MODELS
from tests.support.bench import BENCH, HAS_SB3, ROOT, run_quick
from tests.support.equal_work import UnequalWork, check_same_rows

SB3 = [] if HAS_SB3 else ["--skip-sb3"]
#: Every script with a command line, by the test below that runs its --quick mode.
QUICK_TESTS = {
    "speed/agents.py": "test_agents_quick_runs_every_configuration",
    "speed/batch_folds.py": "test_batch_folds_quick_checks_every_copy_against_its_fold",
    "speed/compile.py": "test_compile_quick_checks_compiled_against_eager",
    "speed/dag.py": "test_dag_quick_plans_the_jobs",
    "speed/dropout.py": "test_dropout_quick_times_both_dropouts",
    "speed/env.py": "test_env_quick_checks_the_same_transitions",
    "speed/eval_vs_train.py": "test_eval_vs_train_quick_times_both_jobs_of_the_shared_run",
    "speed/evaluate.py": "test_evaluate_quick_checks_equal_summaries",
    "speed/evaluate_job.py": "test_evaluate_job_quick_checks_the_positions_against_lockstep",
    "speed/features.py": "test_features_quick_compares_equal_rows",
    "speed/gae.py": "test_gae_quick_times_both_sides_after_checking_equal_work",
    "speed/hyperopt_cost.py": "test_hyperopt_cost_quick_times_every_corner",
    "speed/hyperopt_scale.py": "tests/postgres/test_bench_hyperopt_scale.py",
    "speed/hyperopt_setup.py": "test_hyperopt_setup_quick_times_both_modes",
    "speed/job_imports.py": "test_job_imports_quick_times_every_stage",
    "speed/launches.py": "test_launches_quick_counts_every_part",
    "speed/models.py": "test_models_quick_reports_every_model",
    "speed/scale.py": "test_scale_quick_measures_every_stage_at_two_lengths",
    "speed/seeds.py": "test_seeds_quick_times_batched_and_sequential_seeds",
    "speed/time_to_quality.py": "test_time_to_quality_quick_runs_both_algorithms",
    "studies/calibration.py": "test_calibration_quick_summarizes_both_arms",
    "studies/coverage.py": "test_coverage_quick_prints_every_table",
    "studies/demo_detectable.py": "test_demo_detectable_quick_on_a_synthetic_run",
    "studies/dqn_design.py": "test_dqn_design_quick_scores_every_variant_in_both_worlds",
    "studies/gate_rules.py": "test_gate_rules_quick_compares_the_rules_on_a_synthetic_run",
    "studies/sanity.py": "test_sanity_quick_runs_the_pipeline_and_checks_the_targets",
    "studies/verdict_size.py": "test_verdict_size_quick_fills_every_column",
    "gpu/gpu_check.py": "tests/test_gpu_check.py",
}


#: The arguments of each run `quick` starts ({out}: the module's temp dir), the longest first (they run two at a time).
RUNS: dict[str, tuple[str, ...]] = {
    "studies/sanity.py": ("--cores", "1", "--json", "{out}/sanity.json"),
    "speed/scale.py": ("--cores", "1", "--json", "{out}/scale.json"),
    "speed/hyperopt_cost.py": ("--json", "{out}/cost.json"),
    "speed/features.py": (),
    "speed/models.py": ("--clock", "cpu", "--rounds", "4", "--json", "{out}/models.json"),
    "speed/time_to_quality.py": tuple(SB3),
    "speed/agents.py": ("--clock", "cpu", *SB3),
    "speed/hyperopt_setup.py": (),
    "speed/seeds.py": (),
    "studies/calibration.py": (),
    "speed/evaluate.py": (),
    "speed/job_imports.py": (),
    "speed/launches.py": (),
    "speed/gae.py": (),
    "speed/batch_folds.py": (),
    "speed/compile.py": (),
    "speed/dropout.py": (),
    "speed/evaluate_job.py": (),
    "speed/env.py": (),
    "studies/demo_detectable.py": (),
    "studies/dqn_design.py": (),
    "studies/gate_rules.py": (
        "--rules",
        "1.0:-",
        "1.5:1.0",
        "1.5:1.0|1.5",
        "--json",
        "{out}/gate_rules.json",
    ),
    "speed/dag.py": (),
    "studies/verdict_size.py": (),
    "studies/coverage.py": (),
}
WORKERS = min(2, os.cpu_count() or 1)
#: A hang guard, not a time budget: the two that run whole Snakemake pipelines get more than run_quick's default,
#: because on a loaded 2-core machine scale.py's two runs went past 240 s.
TIMEOUTS = {"studies/sanity.py": 600, "speed/scale.py": 600}


class QuickRuns:
    """The --quick runs of the selected tests, started together (`WORKERS` at a time); `stdout` waits for one."""

    def __init__(self, out: Path, pool: ThreadPoolExecutor, scripts: list[str]) -> None:
        self.out = out
        self.futures: dict[str, Future[str]] = {
            script: pool.submit(
                run_quick,
                script,
                *(a.format(out=out) for a in RUNS[script]),
                timeout=TIMEOUTS.get(script, 240),
            )
            for script in scripts
        }

    def stdout(self, script: str) -> str:
        return self.futures[script].result()


@pytest.fixture(scope="module")
def quick(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuickRuns]:
    selected = {item.name for item in request.session.items if item.module is request.module}
    scripts = [script for script in RUNS if QUICK_TESTS[script] in selected]
    with ThreadPoolExecutor(WORKERS) as pool:
        yield QuickRuns(tmp_path_factory.mktemp("bench-quick"), pool, scripts)


def _has_main(path: Path) -> bool:
    return 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")


def test_every_script_has_a_quick_mode_a_test_and_a_readme_entry() -> None:
    """The scripts are those with a command line; the seeds_* parts are modules of speed/seeds.py."""
    scripts = sorted(str(p.relative_to(BENCH)) for p in BENCH.rglob("*.py") if _has_main(p))
    assert scripts == sorted(QUICK_TESTS)
    in_here = {script for script, test in QUICK_TESTS.items() if not test.startswith("tests/")}
    assert set(RUNS) == in_here - {
        "speed/eval_vs_train.py"
    }  # that one needs the shared run: not started early
    assert not [p.name for p in BENCH.glob("*.py")], "bench/ holds folders by role only (bench/README.md)"
    module = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    tests = {node.name for node in module.body if isinstance(node, ast.FunctionDef)}
    readme = (BENCH / "README.md").read_text(encoding="utf-8")
    for script, test in QUICK_TESTS.items():
        assert "--quick" in (BENCH / script).read_text(encoding="utf-8"), script
        assert test in tests or (ROOT / test).is_file(), (script, test)
        command = rf"`[^`\n]*bench/{re.escape(script)}[^`\n]*--quick[^`\n]*`"
        assert re.search(command, readme), f"bench/README.md has no `... bench/{script} ... --quick` command"
    for part in BENCH.rglob("*.py"):
        if not _has_main(part):  # a module of a script beside it, listed in the README's table of its folder
            assert f"`{part.name}`" in readme, part


# ------------------------------------------------------------------------------------------------------ speed


@pytest.mark.bench
def test_features_quick_compares_equal_rows(quick: QuickRuns) -> None:
    out = quick.stdout("speed/features.py")
    assert "equal work (checked before timing" in out
    assert "read_bars CME / UTC calendar" in out and "(b)/(a) =" in out
    rows = [line for line in out.splitlines() if line.startswith("(b)/(a)")]
    assert len(rows) == 1 and "rows out each" in rows[0]


def test_unequal_rows_fail_in_one_line_naming_the_row() -> None:
    ts = pl.Series([1_705_000_000 * 10**9 + k * 60 * 10**9 for k in range(3)]).cast(pl.Datetime("ns", "UTC"))
    rows = pl.DataFrame(
        {"instrument_id": [1, 1, 1], "ts_event": ts, "trading_day": [dt.date(2024, 1, 12)] * 3}
    )
    assert check_same_rows(rows, rows, "bars in") == 3
    with pytest.raises(UnequalWork) as raised:
        check_same_rows(rows, rows.head(2), "bars in")
    message = str(raised.value)
    assert "\n" not in message and "bars in: stage 3 rows, naive 2" in message and "only in stage" in message


@pytest.mark.bench
def test_env_quick_checks_the_same_transitions(quick: QuickRuns) -> None:
    out = quick.stdout("speed/env.py")
    assert "equal work (checked before timing)" in out and "TradingEnv and PlainGymEnv agree" in out
    assert sum(line.strip().startswith(("1 |", "64 |")) for line in out.splitlines()) == 2


@pytest.mark.bench
def test_agents_quick_runs_every_configuration(quick: QuickRuns) -> None:
    out = quick.stdout("speed/agents.py")
    for name in ("ppo-64", "dqn-64", "ppo-sb3-defaults", "ppo-1024", "dqn-1024"):
        assert any(line.startswith(name) for line in out.splitlines()), name


@pytest.mark.bench
def test_time_to_quality_quick_runs_both_algorithms(quick: QuickRuns) -> None:
    out = quick.stdout("speed/time_to_quality.py")
    assert "oracle sign(ret_15) validation Sharpe" in out
    for config in ("ppo-64", "dqn-64"):
        libraries = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith(config)]
        assert libraries == (["marketrl", "sb3"] if HAS_SB3 else ["marketrl"]), config


@pytest.mark.bench
def test_dqn_design_quick_scores_every_variant_in_both_worlds(quick: QuickRuns) -> None:
    out = quick.stdout("studies/dqn_design.py")
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith(("| clear", "| noedge"))]
    cells = {(row[0].strip(), row[3].strip()) for row in rows}
    variants = ("default", "no_normalize", "no_all_actions", "no_cost_prior", "none")
    assert cells == {(world, variant) for world in ("clear", "noedge") for variant in variants}
    for row in rows:  # every figure is a finite number (the oracle share only where there is an oracle)
        assert all(math.isfinite(float(value)) for value in (row[4], row[6], row[7]))
        assert (row[5].strip() == "—") == (row[0].strip() == "noedge")


@pytest.mark.bench
def test_gae_quick_times_both_sides_after_checking_equal_work(quick: QuickRuns) -> None:
    """The script checked the host and device sides equal (it exits otherwise) and timed both at each size."""
    out = quick.stdout("speed/gae.py")
    rows = [line.split("|")[1:-1] for line in out.splitlines() if re.match(r"\| [\d,]+ \|", line)]
    assert [int(row[0].replace(",", "")) for row in rows] == [256, 4096]
    assert all(float(row[1]) > 0 and float(row[2]) > 0 for row in rows)


@pytest.mark.bench
def test_batch_folds_quick_checks_every_copy_against_its_fold(quick: QuickRuns) -> None:
    """F folds batched against the same folds one after another, for both agents and two forecasters (the MLP
    vmapped, the LSTM seed after seed) at F = 1 and 2; the script checked every batched copy against its fold's
    sequential run (it exits otherwise)."""
    out = quick.stdout("speed/batch_folds.py")
    models = ("ppo", "dqn", "mlp", "lstm")
    rows = [
        line.split("|")[1:-1]
        for line in out.splitlines()
        if line.startswith(tuple(f"| {m} " for m in models))
    ]
    assert [(row[0].strip(), int(row[1])) for row in rows] == [(m, f) for m in models for f in (1, 2)]
    assert all(row[-1].strip() == "yes" and float(row[6]) > 0 for row in rows)


@pytest.mark.bench
def test_compile_quick_checks_compiled_against_eager(quick: QuickRuns) -> None:
    """Both agents' captured calls compiled against eager (the script exits if they end apart), or the one line
    that says why torch cannot compile on this machine."""
    out = quick.stdout("speed/compile.py")
    if "compile unavailable here" in out:
        return
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith(("| ppo", "| dqn"))]
    assert [row[0].strip() for row in rows] == ["ppo", "dqn"]
    assert all(row[-1].strip() == "yes" for row in rows)


@pytest.mark.bench
def test_launches_quick_counts_every_part(quick: QuickRuns) -> None:
    """Every part counted; with the update captured, what the host issues per PPO epoch does not grow with the
    minibatches (the graph holds them) and a DQN gradient step leaves the host a handful of operations."""
    out = quick.stdout("speed/launches.py")
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith(("| dqn", "| ppo"))]
    counts = {
        (row[0].strip(), int(row[1]), row[2].strip()): [float(cell) for cell in row[3:6]] for row in rows
    }
    for n_seeds in (1, 2):
        assert ("dqn", n_seeds, "vector step (act, env, replay insert)") in counts
        ops, inside, host = counts[("dqn", n_seeds, "gradient step")]
        assert inside > 0.9 * ops and host < 0.1 * ops
        one, two = (counts[("ppo", n_seeds, f"epoch of {m} minibatches")] for m in (1, 2))
        assert two[1] > 1.8 * one[1]  # eager: the minibatches' operations, inside the captured call
        assert two[2] == one[2] < 0.1 * one[0]  # captured: the host's share per epoch, flat
    assert all(float(row[3]) > 0 for row in rows)


@pytest.mark.bench
def test_scale_quick_measures_every_stage_at_two_lengths(quick: QuickRuns) -> None:
    """Both lengths ran the whole pipeline; every stage of the DAG has its jobs, costs and a growth exponent,
    the features jobs their exact CPU from their logs; the checks are there and the per-fold train CPU has a figure
    once there are two folds."""
    out = quick.stdout("speed/scale.py")
    record = json.loads((quick.out / "scale.json").read_text())
    runs = record["runs"]
    assert [run["days"] for run in runs] == [8, 12] and record["models"] == ["linear"]
    assert runs[0]["folds"] < runs[1]["folds"]
    for run in runs:
        assert run["wall_s"] > 0 and run["cpu_s"] > 0
        stages = run["stages"]
        assert {"demo_data", "features", "folds", "hyperopt", "train", "evaluate", "report"} <= set(stages)
        assert stages["train"]["jobs"] == run["folds"] and len(run["train_fold_cpu"]) == run["folds"]
        assert all(stage["jobs"] >= 1 and stage["max_rss_mb"] > 0 for stage in stages.values())
        assert stages["train"]["cpu_s"] > 0 and stages["evaluate"]["cpu_s"] > 0
        # every features job logged its exact cost (what the features check divides by)
        assert stages["features"]["logged_jobs"] == stages["features"]["jobs"]
        assert stages["features"]["logged_cpu_s"] > 0
    assert re.search(r"^\| train \| .* \| -?[0-9.]+ \|$", out, flags=re.M)  # its fitted growth
    checks = {(c["days"], c["check"]) for c in record["checks"]}
    assert (12, "no job above 4,096 MB") in checks and len(checks) == 6


@pytest.mark.bench
def test_dropout_quick_times_both_dropouts(quick: QuickRuns) -> None:
    """Both sides timed after the equal-work check (same weights, same loss without dropout) passed."""
    out = quick.stdout("speed/dropout.py")
    rates = dict(re.findall(r"^\| (per value|per feature) \| ([0-9.]+) \|$", out, flags=re.M))
    assert set(rates) == {"per value", "per feature"}
    assert all(float(rate) > 0 for rate in rates.values())
    assert re.search(r"^per feature / per value: [0-9.]+x \(median of 2 rounds\)$", out, flags=re.M)


@pytest.mark.bench
def test_models_quick_reports_every_model(quick: QuickRuns) -> None:
    """Every registered model through its real train call and its floor: the torch models read the host once per
    `check_every` steps (the floor never), the sample counts follow from steps × batch, and the script's own
    parity checks pass (floor module = trainer's module, LightGBM floor = trained booster, ridge floor = fitted
    weights). `--rounds 4` beats the quick mode's 10."""
    stdout = quick.stdout("speed/models.py")
    report = json.loads((quick.out / "models.json").read_text())
    args = report["args"]
    assert (args["days"], args["steps"], args["check_every"], args["rounds"], args["repeats"]) == (
        2,
        10,
        5,
        4,
        1,
    )
    assert report["features"] == len(CATALOG)
    results = {r["model"]: r for r in report["results"]}
    assert list(results) == list(MODELS)
    for name, r in results.items():
        assert len(r["model_s"]) == len(r["floor_s"]) == 1, name
        assert r["model_samples_per_s"] > 0 and r["floor_samples_per_s"] > 0, name
        assert math.isfinite(r["model_over_floor"]) and r["model_over_floor"] > 0, name
        if MODELS[name].neural:
            assert r["steps"] == 10 and r["samples"] == 10 * r["batch"], name
            assert r["model_syncs"] == 2 and r["floor_syncs"] == 0, name  # one read per check_every steps
            # the cpu clock has no loop figure (the trainer's own rate is wall-clock)
            assert r["loop_s"] == [] and r["loop_over_floor"] is None, name
        else:
            assert r["model_syncs"] is None and r["floor_syncs"] is None, name
    assert results["lightgbm"]["samples"] == 4 * results["lightgbm"]["train_rows"]
    assert results["linear"]["samples"] == results["linear"]["train_rows"] > 0
    assert stdout.count("\n| ") == len(MODELS) + 1  # the markdown table: header and one row per model


@pytest.mark.bench
def test_models_bad_arguments_fail_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "speed" / "models.py"), "--quick", "--check-every", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2 and "--check-every: expected an integer >= 1, got -1" in done.stderr


@pytest.mark.bench
def test_seeds_quick_times_batched_and_sequential_seeds(quick: QuickRuns) -> None:
    out = quick.stdout("speed/seeds.py")
    lines = out.splitlines()
    ppo = [line.split("|") for line in lines if line.startswith("ppo ")]
    assert [int(row[1]) for row in ppo] == [1, 2]
    assert all(int(row[2]) == 128 * 64 for row in ppo)  # the same env steps per seed on both sides
    assert sum("no S can beat" in line for line in lines) == 1  # the per-seed / shared split
    dqn = [line.split() for line in lines if line.startswith("dqn ")]
    assert [row[1] for row in dqn] == ["1", "2"]
    assert all(row[-1] == "yes" for row in dqn)  # seed i of the batch ended as its sequential run
    forecasters = [line for line in lines if line.startswith(("| mlp", "| lstm", "| transformer"))]
    assert len(forecasters) == 3 * 2  # each model at S = 1 and 2


@pytest.mark.bench
def test_evaluate_quick_checks_equal_summaries(quick: QuickRuns) -> None:
    out = quick.stdout("speed/evaluate.py")
    assert "same summaries, daily returns and per-bar frames: yes" in out
    assert "speed-up:" in out and "policy inference" in out


@pytest.mark.bench
def test_evaluate_job_quick_checks_the_positions_against_lockstep(quick: QuickRuns) -> None:
    out = quick.stdout("speed/evaluate_job.py")
    assert "equal work (checked after timing): the evaluation's positions are the lockstep pass's" in out
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["model"] == "dqn (quick)" and figures["job_cpu"] >= 0 and figures["imports_cpu"] > 0


@pytest.mark.bench
def test_eval_vs_train_quick_times_both_jobs_of_the_shared_run(shared_run: Path, tmp_path: Path) -> None:
    """On a copy of the session's finished run (the script copies it; the shared run is only read)."""
    out = run_quick("speed/eval_vs_train.py", str(shared_run), str(tmp_path / "scratch"), timeout=400)
    rows = [line.split(" | ") for line in out.splitlines()[1:]]
    assert len(rows) == 1 and rows[0][:2] == ["dqn", "1×"], out  # the run's first model, at its own budget
    assert float(rows[0][2]) > 0 and float(rows[0][3]) > 0


@pytest.mark.bench
def test_hyperopt_cost_quick_times_every_corner(quick: QuickRuns) -> None:
    out = quick.stdout("speed/hyperopt_cost.py")
    report = json.loads((quick.out / "cost.json").read_text())
    assert (report["trial_steps"], report["trial_updates"]) == (1024, 10)  # the quick budgets
    models = {m["model"]: m for m in report["models"]}
    assert list(models) == ["dqn", "mlp"]
    for name, m in models.items():
        assert len(m["median_trials"]) == 2, name
        assert len(m["corners"]) == 2 ** len(m["drivers"]), name  # every combination of the drivers' extremes
        assert len({tuple(c["hparams"][d] for d in m["drivers"]) for c in m["corners"]}) == len(m["corners"])
        for trial in m["median_trials"] + m["corners"]:
            assert trial["cpu_s"] > 0 and trial["proxy"] > 0, name
            assert trial["ratio"] == pytest.approx(trial["cpu_s"] / m["median_s"]), name
        assert m["worst_ratio"] == max(c["ratio"] for c in m["corners"]), name
        assert out.count(f"**{name}**: median trial") == 1
    assert "worst corner over all models:" in out and "log-log correlation" in out


@pytest.mark.bench
def test_hyperopt_setup_quick_times_both_modes(quick: QuickRuns) -> None:
    out = quick.stdout("speed/hyperopt_setup.py")
    assert [line.split()[0] for line in out.splitlines()[2:4]] == ["shared", "reload"]
    assert "setup time reload/shared:" in out


@pytest.mark.bench
def test_job_imports_quick_times_every_stage(quick: QuickRuns) -> None:
    out = quick.stdout("speed/job_imports.py")
    rows = [line.split(" | ") for line in out.splitlines()[2:]]
    assert [row[0].strip("| ") for row in rows] == ["features", "hyperopt_worker", "train", "evaluate"]
    assert rows[0][-1].strip(" |") == "no"  # the features job never imports torch (tests/test_imports.py)


@pytest.mark.bench
def test_dag_quick_plans_the_jobs(quick: QuickRuns) -> None:
    out = quick.stdout("speed/dag.py")
    assert re.search(r"^folds=2 models=\d+ seeds=1 jobs=\d+$", out, re.MULTILINE), out
    assert "dry-run wall time:" in out


# ---------------------------------------------------------------------------------------------------- studies


@pytest.mark.bench
def test_calibration_quick_summarizes_both_arms(quick: QuickRuns) -> None:
    out = quick.stdout("studies/calibration.py")
    assert "K = 1 worlds per arm" in out and "False-positive rate (edge 0" in out
    arms = [
        line
        for line in out.splitlines()
        if line.startswith(("| 0 | none | 4 | 1 |", "| 10 | reversion | 4 | 1 |"))
    ]
    assert len(arms) == 2, out


@pytest.mark.bench
def test_coverage_quick_prints_every_table(quick: QuickRuns) -> None:
    out = quick.stdout("studies/coverage.py")
    titles = [
        line.split(",")[0] for line in out.splitlines() if line and not line.startswith(("|", "bench/"))
    ]
    assert titles == [
        "Tails of t* vs the true studentized Sharpe",
        "Tails of t* vs the true studentized Sharpe",
        "Sharpe CI coverage (nominal 95%)",
        *["False claims with no edge (2 models x 3 baselines x 2 directions)"] * 3,
        "Seed-IQM CI coverage (nominal 95%)",
    ]


@pytest.mark.bench
def test_verdict_size_quick_fills_every_column(quick: QuickRuns) -> None:
    out = quick.stdout("studies/verdict_size.py")
    rows = [line for line in out.splitlines() if line.startswith("| 0 | 20 | 2 |")]
    assert [row.rsplit("|", 2)[1].strip() for row in rows] == ["100% of days", "10% of days"], out
    assert all(row.count("|") == 11 and "nan" not in row for row in rows)


@pytest.mark.bench
def test_demo_detectable_quick_on_a_synthetic_run(quick: QuickRuns) -> None:
    out = quick.stdout("studies/demo_detectable.py")
    rows = [line.split(" | ") for line in out.splitlines()[2:]]
    assert [row[0] for row in rows] == ["| 3", "| 6 (all)"]
    assert all(float(row[1]) > 0 and float(row[2]) > 0 for row in rows)


@pytest.mark.bench
def test_gate_rules_quick_compares_the_rules_on_a_synthetic_run(quick: QuickRuns) -> None:
    """The walk-forward record (1.5:1.0) holds the churner flat after fold 0 and lets both earner seeds trade the
    later folds; the validation gate alone (1.0:-) lets the churner trade every fold."""
    out = quick.stdout("studies/gate_rules.py")
    table = json.loads((quick.out / "gate_rules.json").read_text())
    validation, record = table["1.0:-"], table["1.5:1.0"]
    # the fallback to the seeds' pooled validation t (0.5 for the churner) keeps the churner flat where the record does
    assert table["1.5:1.0|1.5"]["churner"] == record["churner"]
    assert record["churner"]["turnover"] < validation["churner"]["turnover"]
    assert record["churner"]["drag"] < validation["churner"]["drag"]
    assert record["earner"]["turnover"] > validation["earner"]["turnover"] and record["earner"]["net"] > 0
    assert [line.split()[0] for line in out.splitlines()[3:]] == ["churner", "earner"]


@pytest.mark.bench
def test_sanity_quick_runs_the_pipeline_and_checks_the_targets(quick: QuickRuns) -> None:
    """The real workflow on the tests' fast tiny config (world clear, one root seed, linear and dqn), then the
    report's figures of the run, the oracle's and the clear world's target: the table and the JSON agree."""
    out = quick.stdout("studies/sanity.py")
    report = json.loads((quick.out / "sanity.json").read_text())
    (run,) = report["runs"]
    assert (run["world"], run["error"], sorted(run["models"])) == ("clear", "", ["dqn", "linear"])
    assert run["test_days"] == 2 and math.isfinite(run["oracle_sharpe"])
    for model, figures in run["models"].items():
        assert figures["cost_drag"] == pytest.approx(figures["gross_sharpe"] - figures["net_sharpe"]), model
        assert figures["turnover"] >= 0 and figures["below_flat"] is None, model  # one seed: no claim
    assert "### clear: data.demo.edge 10, edge_kind reversion" in out and "oracle (−sign(ret_5)" in out
    rows = [line for line in out.splitlines() if line.startswith(("| dqn |", "| linear |", "| **"))]
    assert len(rows) == 4, out  # per model: its root seed's row and its mean row
    (target,) = report["targets"]
    assert target["world"] == "clear" and target["result"] in ("PASS", "FAIL")
    assert f"| clear | {target['target']} |" in out
