"""The Python half of `make test-slurm` (tests/slurm/run_slurm_test.sh).

    python -m tests.slurm.slurm_checks config  TINY_CONFIG OUT_CONFIG
    python -m tests.slurm.slurm_checks profile SLURM_PROFILE OUT_DIR
    python -m tests.slurm.slurm_checks check --slurm-run DIR --local-run DIR --scontrol FILE --squeue FILE \
        [--postgres-password-file FILE]

`config` writes the test's pipeline config, `profile` fits profiles/slurm to the one small test node, `check`
verifies a pipeline run through SLURM: every output, GPU requests and their serialization, the hyperopt workers,
and equality with a local run of the same config. With --postgres-password-file the SLURM run's hyperopt used a
PostgreSQL study and the local run its own journal study: the two studies must agree, and the password must appear
in no output. `check` prints its evidence and exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

GPU_RULES = ("hyperopt_worker", "train", "evaluate")
HYPEROPT_WORKERS = 2
# Resources of the one test node: a job asking for more would never schedule there.
TEST_MEM_MB = 1500
TEST_RUNTIME_MIN = 30
# First status check after this many seconds (the plugin's default 40 s would dominate a run of short jobs).
TEST_STATUS_DELAY_S = 2
# Keys whose values differ between any two runs: wall times, throughput, and the checkout's commit (provenance;
# it changes when someone commits between the two runs, which alone cannot change a number).
VOLATILE_KEY = re.compile(
    r"(^|_)(s|sec|secs|second|seconds|time|timestamp|elapsed|wall|sps|created)$|_at$|^git_commit$"
)
COMMENT = re.compile(r"^rule_(?P<rule>.+?)(?:_wildcards_(?P<wildcards>.*))?$")
GPU_COUNT = re.compile(r"gpu(?::[^:,\s]+)?:(\d+)")


class CheckError(ValueError):
    """A malformed input of the checks (scontrol dump, squeue snapshots, profile)."""


# ------------------------------------------------------------------------------------------------ config, profile


def run_config(tiny: dict[str, Any]) -> dict[str, Any]:
    """The tiny config with two hyperopt workers and GPU requests forced on, while training stays on the CPU."""
    config = json.loads(json.dumps(tiny))
    config["hyperopt"]["workers"] = HYPEROPT_WORKERS
    config["training"]["device"] = "cpu"
    config["training"]["gpu_jobs"] = "always"
    return config


def fit_profile(profile: dict[str, Any]) -> dict[str, Any]:
    """profiles/slurm fitted to the test node: one thread per job, small memory and time limits, quick polling.

    Everything else (executor, status command, log directory) is kept, so the test exercises the shipped profile.
    """
    for key in ("executor", "set-resources", "set-threads", "default-resources"):
        if key not in profile:
            raise CheckError(f"profiles/slurm/config.yaml: missing key {key!r}")
    if profile["executor"] != "slurm":
        raise CheckError(f"profiles/slurm/config.yaml: executor is {profile['executor']!r}, expected 'slurm'")
    fitted = json.loads(json.dumps(profile))
    fitted["jobs"] = 16
    fitted["latency-wait"] = 5
    fitted["slurm-init-seconds-before-status-checks"] = TEST_STATUS_DELAY_S
    fitted["slurm-keep-successful-logs"] = True
    fitted["set-threads"] = {rule: 1 for rule in fitted["set-threads"]}
    fitted["default-resources"] = _fit_resources(fitted["default-resources"])
    fitted["set-resources"] = {rule: _fit_resources(res) for rule, res in fitted["set-resources"].items()}
    return fitted


def _fit_resources(resources: dict[str, Any]) -> dict[str, Any]:
    fitted = dict(resources)
    if "mem_mb" in resources:  # absent: the rule's own request (its memory model) stands
        fitted["mem_mb"] = min(int(resources["mem_mb"]), TEST_MEM_MB)
    fitted["runtime"] = min(int(resources.get("runtime", TEST_RUNTIME_MIN)), TEST_RUNTIME_MIN)
    return fitted


# ------------------------------------------------------------------------------------------------ SLURM evidence


@dataclass(frozen=True)
class SlurmJob:
    """One job of the pipeline as `scontrol show job -o` reports it after the run."""

    job_id: int
    rule: str
    wildcards: str
    state: str
    gpus: int
    start: dt.datetime
    end: dt.datetime


def parse_scontrol_jobs(text: str) -> list[SlurmJob]:
    """Pipeline jobs (those whose comment is the plugin's `rule_<name>[_wildcards_<values>]`) of an scontrol dump."""
    jobs = []
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        fields = dict(token.partition("=")[::2] for token in line.split() if "=" in token)
        match = COMMENT.match(fields.get("Comment", ""))
        if match is None:
            continue  # e.g. the script's own `srun hostname` probe
        try:
            start = dt.datetime.fromisoformat(fields["StartTime"])
            end = dt.datetime.fromisoformat(fields["EndTime"])
        except (KeyError, ValueError) as exc:
            raise CheckError(f"scontrol job {fields.get('JobId')}: no start/end time ({exc})") from exc
        gpu_text = " ".join(fields.get(key, "") for key in ("TresPerJob", "TresPerNode", "TresPerTask"))
        gpus = sum(int(n) for n in GPU_COUNT.findall(gpu_text))
        jobs.append(
            SlurmJob(
                job_id=int(fields["JobId"]),
                rule=match["rule"],
                wildcards=match["wildcards"] or "",
                state=fields.get("JobState", ""),
                gpus=gpus,
                start=start,
                end=end,
            )
        )
    return jobs


def overlapping_pairs(jobs: Sequence[SlurmJob]) -> list[tuple[SlurmJob, SlurmJob]]:
    """Pairs of jobs whose run times overlap (times have one-second resolution, so touching ends do not count)."""
    ordered = sorted(jobs, key=lambda job: (job.start, job.end))
    return [
        (first, second)
        for i, first in enumerate(ordered)
        for second in ordered[i + 1 :]
        if second.start < first.end and first.start < second.end
    ]


def parse_squeue_snapshots(text: str) -> list[dict[int, str]]:
    """Snapshots written as a `t=<epoch>` line followed by `jobid|comment|state|reason` rows: {job id: state}."""
    snapshots: list[dict[int, str]] = []
    for line in text.splitlines():
        if line.startswith("t="):
            snapshots.append({})
        elif line.strip() and snapshots:
            parts = line.split("|")
            if len(parts) < 3 or not parts[0].strip().isdigit():
                raise CheckError(f"squeue snapshot: unexpected row {line!r}")
            snapshots[-1][int(parts[0])] = parts[2].strip()
    return snapshots


def most_gpu_jobs_queued(snapshots: Iterable[dict[int, str]], gpu_job_ids: set[int]) -> tuple[int, bool]:
    """(most GPU jobs seen in the queue at once, whether a GPU job ever waited while another ran)."""
    most, waited = 0, False
    for snapshot in snapshots:
        states = [state for job_id, state in snapshot.items() if job_id in gpu_job_ids]
        most = max(most, len(states))
        waited |= "RUNNING" in states and "PENDING" in states
    return most, waited


# ------------------------------------------------------------------------------------------------ outputs


def expected_outputs(config: dict[str, Any]) -> list[str]:
    """Every file the pipeline must produce for `config`."""
    from marketrl.workflow import pipeline

    files = [*pipeline.raw_data_files(config).values(), *pipeline.feature_files(config)]
    files += ["results/features/manifest.json", "results/folds.json", "results/eval_report.html"]
    for model in config["training"]["models"]:
        files += [f"results/hyperopt/{model}.json", *pipeline.hyperopt_worker_files(config, model)]
    files += pipeline.model_files(config) + pipeline.train_log_files(config)
    for path in pipeline.eval_files(config):
        files += [path, path.replace("metrics.json", "bars.parquet")]
    return files


def json_differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Paths at which two JSON documents differ, ignoring timing keys (wall times, throughput)."""
    if isinstance(a, dict) and isinstance(b, dict):
        diffs = [f"{where}/{key}: only in one run" for key in sorted(set(a) ^ set(b), key=str)]
        for key in sorted(set(a) & set(b), key=str):
            if not VOLATILE_KEY.search(str(key)):
                diffs += json_differences(a[key], b[key], f"{where}/{key}")
        return diffs
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} vs {len(b)} items"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in json_differences(x, y, f"{where}[{i}]")
        ]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def file_differences(slurm_file: Path, local_file: Path) -> list[str]:
    """How a SLURM-run output differs from the local run's (empty when equal in content)."""
    if slurm_file.read_bytes() == local_file.read_bytes():
        return []
    suffix = slurm_file.name.rsplit(".", 1)[-1]
    if suffix == "json":
        return json_differences(json.loads(slurm_file.read_text()), json.loads(local_file.read_text()))
    if suffix == "parquet":
        import polars as pl

        equal = pl.read_parquet(slurm_file).equals(pl.read_parquet(local_file))
        return [] if equal else ["table content differs"]
    if suffix == "pt":
        import torch

        a = torch.load(slurm_file, weights_only=True, map_location="cpu")
        b = torch.load(local_file, weights_only=True, map_location="cpu")
        return _state_differences(a, b, "")
    return ["bytes differ"]


def _state_differences(a: Any, b: Any, where: str) -> list[str]:
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (
            []
            if a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
            else [f"{where}: tensor differs"]
        )
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where}: keys differ"]
        return [
            d
            for key in a
            if not VOLATILE_KEY.search(str(key))
            for d in _state_differences(a[key], b[key], f"{where}/{key}")
        ]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _state_differences(x, y, f"{where}[{i}]")
        ]
    return json_differences(a, b, where)


# ------------------------------------------------------------------------------------------------ the checks


def check_run(
    slurm_run: Path,
    local_run: Path,
    scontrol_text: str,
    squeue_text: str,
    postgres_password: str | None = None,
) -> tuple[list[str], list[str]]:
    """(evidence lines, failures) for a SLURM run of `slurm_run/config.yaml` against the local run of it.

    `postgres_password`: the SLURM run's hyperopt used PostgreSQL (with this password) and the local run ran its
    own hyperopt on the journal; otherwise the local run reused the SLURM run's hyperopt results."""
    from marketrl.settings.config import load_config

    config = load_config(slurm_run / "config.yaml")
    evidence: list[str] = []
    failures: list[str] = []
    expected = expected_outputs(config)

    missing = [path for path in expected if not (slurm_run / path).is_file()]
    failures += [f"SLURM run: missing output {path}" for path in missing]
    evidence.append(f"outputs: {len(expected) - len(missing)}/{len(expected)} expected files present")

    # The local run reused the SLURM run's hyperopt results (see run_slurm_test.sh); everything else is its own.
    compared = [p for p in expected if not p.startswith("results/hyperopt/") and not p.endswith(".html")]
    differing = 0
    for path in compared:
        if not (local_run / path).is_file() or not (slurm_run / path).is_file():
            failures.append(f"local vs SLURM: {path} missing in one run")
            continue
        diffs = file_differences(slurm_run / path, local_run / path)
        if diffs:
            differing += 1
            failures.append(f"local vs SLURM: {path} differs: {'; '.join(diffs[:5])}")
    if postgres_password is None:
        for path in [p for p in expected if p.startswith("results/hyperopt/")]:
            if (local_run / path).is_file() and (local_run / path).read_bytes() != (
                slurm_run / path
            ).read_bytes():
                failures.append(f"local run re-ran hyperopt instead of reusing {path}")
    evidence.append(f"local vs SLURM: {len(compared) - differing}/{len(compared)} outputs equal in content")
    if postgres_password is not None:
        failures += _postgres_failures(slurm_run, local_run, config, postgres_password, evidence)

    jobs = parse_scontrol_jobs(scontrol_text)
    failures += [
        f"SLURM job {j.job_id} ({j.rule} {j.wildcards}) ended {j.state}"
        for j in jobs
        if j.state != "COMPLETED"
    ]
    gpu_jobs = [job for job in jobs if job.rule in GPU_RULES]
    n_models = len(config["training"]["models"]) * config["folds"]["n"] * config["training"]["seeds"]
    n_gpu_expected = len(config["training"]["models"]) * HYPEROPT_WORKERS + 2 * n_models
    if len(gpu_jobs) != n_gpu_expected:
        failures.append(f"expected {n_gpu_expected} GPU-rule SLURM jobs, scontrol shows {len(gpu_jobs)}")
    failures += [
        f"SLURM job {j.job_id} ({j.rule} {j.wildcards}): no GPU request" for j in gpu_jobs if j.gpus != 1
    ]
    failures += [
        f"SLURM job {j.job_id} ({j.rule}): unexpected GPU request"
        for j in jobs
        if j.rule not in GPU_RULES and j.gpus
    ]
    evidence.append(
        f"SLURM jobs: {len(jobs)}, of which {len(gpu_jobs)} from {'/'.join(GPU_RULES)}, "
        f"{sum(j.gpus == 1 for j in gpu_jobs)} of them submitted with one GPU (TresPerJob gres:gpu:1)"
    )
    overlaps = overlapping_pairs(gpu_jobs)
    failures += [
        f"GPU jobs {a.job_id} and {b.job_id} ran at the same time on the one GPU" for a, b in overlaps
    ]
    most, waited = most_gpu_jobs_queued(parse_squeue_snapshots(squeue_text), {j.job_id for j in gpu_jobs})
    if most < 2 or not waited:
        failures.append(
            f"squeue never showed a GPU job waiting while another ran (most queued at once: {most}): "
            "the one-at-a-time evidence must come from SLURM, not from Snakemake holding jobs back"
        )
    evidence.append(
        f"GPU jobs ran one at a time: {len(overlaps)} overlapping pairs; up to {most} GPU jobs queued at once, "
        f"{'some' if waited else 'none'} PENDING while another RUNNING"
    )

    failures += _hyperopt_failures(slurm_run, config, jobs, evidence)
    return evidence, failures


# Which worker ran which trial, and where the study lives, legitimately differ between the two runs.
STUDY_RUN_KEYS = ("workers", "storage")


def _postgres_failures(
    slurm_run: Path, local_run: Path, config: dict[str, Any], password: str, evidence: list[str]
) -> list[str]:
    failures = []
    for model in config["training"]["models"]:
        path = f"results/hyperopt/{model}.json"
        if not (slurm_run / path).is_file() or not (local_run / path).is_file():
            failures.append(f"PostgreSQL vs journal: {path} missing in one run")
            continue
        pg_study, journal_study = (json.loads((run / path).read_text()) for run in (slurm_run, local_run))
        if not str(pg_study.get("storage", "")).startswith("postgresql://"):
            failures.append(f"{path}: SLURM run's storage is {pg_study.get('storage')!r}, not PostgreSQL")
        if not str(journal_study.get("storage", "")).endswith("journal.log"):
            failures.append(
                f"{path}: local run's storage is {journal_study.get('storage')!r}, not the journal"
            )
        locks = [
            f.name
            for f in (slurm_run / f"results/hyperopt/{model}").glob("*")
            if not f.name.endswith(".json")
        ]
        if locks:
            failures.append(f"SLURM run with PostgreSQL left files beside the worker summaries: {locks}")
        diffs = json_differences(
            {k: v for k, v in pg_study.items() if k not in STUDY_RUN_KEYS},
            {k: v for k, v in journal_study.items() if k not in STUDY_RUN_KEYS},
        )
        if diffs:
            failures.append(
                f"PostgreSQL (2 SLURM workers) vs journal (local) study {model}: {'; '.join(diffs[:5])}"
            )
        evidence.append(
            f"hyperopt {model}: PostgreSQL study of the SLURM workers equals the local journal study "
            f"({len(pg_study.get('trials', []))} trials, best {pg_study.get('best_value')!r}): "
            + ("yes" if not diffs else "NO")
        )
    leaked = [
        str(f.relative_to(slurm_run))
        for root in (slurm_run / "results", slurm_run / ".snakemake")
        for f in root.rglob("*")
        if f.is_file() and password.encode() in f.read_bytes()
    ]
    failures += [f"the PostgreSQL password appears in {name}" for name in leaked]
    evidence.append(f"PostgreSQL password in outputs, logs or .snakemake/: {len(leaked)} files")
    return failures


def _hyperopt_failures(
    slurm_run: Path, config: dict[str, Any], jobs: Sequence[SlurmJob], evidence: list[str]
) -> list[str]:
    failures = []
    n_trials = config["hyperopt"]["n_trials"]
    for model in config["training"]["models"]:
        job_ids = {}
        trials: dict[int, list[int]] = {}
        for worker in range(HYPEROPT_WORKERS):
            matching = [
                j.job_id for j in jobs if j.rule == "hyperopt_worker" and j.wildcards == f"{model}_{worker}"
            ]
            if len(matching) != 1:
                failures.append(f"hyperopt {model} worker {worker}: expected one SLURM job, found {matching}")
            job_ids[worker] = matching[0] if matching else None
            summary_path = slurm_run / f"results/hyperopt/{model}/worker_{worker}.json"
            if summary_path.is_file():
                trials[worker] = list(json.loads(summary_path.read_text())["trials_run"])
        claimed = [n for ran in trials.values() for n in ran]
        if sorted(claimed) != list(range(n_trials)):
            failures.append(
                f"hyperopt {model}: workers ran trials {trials}, expected 0..{n_trials - 1} once each"
            )
        if len(set(job_ids.values())) != HYPEROPT_WORKERS or None in job_ids.values():
            failures.append(f"hyperopt {model}: workers did not run as separate SLURM jobs: {job_ids}")
        study_path = slurm_run / f"results/hyperopt/{model}.json"
        if study_path.is_file():
            study = json.loads(study_path.read_text())
            numbers = sorted(trial["number"] for trial in study["trials"])
            if numbers != list(range(n_trials)):
                failures.append(
                    f"hyperopt {model}: the study holds trials {numbers}, expected 0..{n_trials - 1}"
                )
        evidence.append(
            f"hyperopt {model}: one study, workers as SLURM jobs "
            + ", ".join(f"{job_ids[w]} (worker {w}: trials {trials.get(w)})" for w in range(HYPEROPT_WORKERS))
        )
    return failures


# ------------------------------------------------------------------------------------------------ command line


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the three subcommands; returns the exit status."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    config_cmd = commands.add_parser("config")
    config_cmd.add_argument("tiny", type=Path)
    config_cmd.add_argument("out", type=Path)
    profile_cmd = commands.add_parser("profile")
    profile_cmd.add_argument("profile", type=Path)
    profile_cmd.add_argument("out_dir", type=Path)
    check_cmd = commands.add_parser("check")
    for name in ("--slurm-run", "--local-run", "--scontrol", "--squeue"):
        check_cmd.add_argument(name, type=Path, required=True)
    check_cmd.add_argument("--postgres-password-file", type=Path)
    args = parser.parse_args(argv)

    if args.command == "config":
        args.out.write_text(
            yaml.safe_dump(run_config(yaml.safe_load(args.tiny.read_text())), sort_keys=False)
        )
        return 0
    if args.command == "profile":
        args.out_dir.mkdir(parents=True, exist_ok=True)
        fitted = fit_profile(yaml.safe_load(args.profile.read_text()))
        (args.out_dir / "config.yaml").write_text(yaml.safe_dump(fitted, sort_keys=False))
        return 0
    password = args.postgres_password_file.read_text().strip() if args.postgres_password_file else None
    evidence, failures = check_run(
        args.slurm_run, args.local_run, args.scontrol.read_text(), args.squeue.read_text(), password
    )
    for line in evidence:
        print(f"test-slurm: {line}")
    for line in failures:
        print(f"test-slurm: FAIL {line}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
