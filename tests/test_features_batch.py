"""features.batch: one features job converts a batch of files (a calendar month by default). Every table is the
same bytes as when its file had a job of its own (build_feature_file), the first file of a batch included (its
context is the batch before), the real samples included; on_bad_file: skip still skips only the bad file. The
workflow side (a table stays addressable, what a changed input reruns, no partial output of a failed batch) is
checked with real Snakemake runs of a two-month demo at the end."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
import zstandard

import marketrl.features.build as build
from marketrl.data.demo import generate_demo_files
from marketrl.data.reader import DataFileError
from marketrl.features import FeatureJob, build_feature_batch, build_feature_file, skipped_reason
from marketrl.settings import paths
from marketrl.settings.config import ConfigError, validate_config
from marketrl.workflow import pipeline
from tests.support.damaged import damaged_copy
from tests.test_workflow import TINY, job_counts, snakemake, workdir_with_config

ESH4_MBO = "nautilus_trader/esh4-glbx-mdp3-20231225.mbo.dbn.zst"  # 988 one-second bars of ESH4 (id 17077)
# Thursday 2024-02-29 .. Tuesday 2024-03-05: files of February and of March (a Sunday file between)
EDGE_DEMO = {"source": "demo", "quotes": "demo", "demo": {"start": "2024-02-28", "days": 5, "seed": 3}}


def _config(batch: str = "month", **data: Any) -> dict[str, Any]:
    return validate_config({"data": {**EDGE_DEMO, **data}, "features": {"batch": batch}})


def _jobs(config: dict[str, Any], out: Path) -> list[list[FeatureJob]]:
    """The workflow's batches of `config` (pipeline.feature_batch_files), their tables under `out`."""
    files = pipeline.raw_data_files(config)
    quotes = pipeline.quote_inputs(config)
    return [
        [
            FeatureJob(
                src=Path(entry["src"]),
                dst=out / Path(entry["dst"]).name,
                context_srcs=tuple(Path(p) for p in entry["context"]),
                quote_srcs=tuple(Path(p) for p in entry["quotes"]),
            )
            for entry in pipeline.feature_batch_files(files, stems, quotes)
        ]
        for stems in pipeline.feature_batches(config).values()
    ]


def _per_file(jobs: list[FeatureJob], out: Path, **options: Any) -> dict[str, bytes]:
    """Each job's table built by its own build_feature_file call under `out`: {name: bytes}."""
    out.mkdir(parents=True, exist_ok=True)
    tables = {}
    for job in jobs:
        dst = out / job.dst.name
        build_feature_file(job.src, dst, context_srcs=job.context_srcs, quote_srcs=job.quote_srcs, **options)
        tables[dst.name] = dst.read_bytes()
    return tables


@pytest.fixture
def edge_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The demo files (and bbo-1m quotes) of EDGE_DEMO, where the workflow's relative paths find them."""
    monkeypatch.chdir(tmp_path)
    demo = EDGE_DEMO["demo"]
    generate_demo_files(Path(paths.DEMO_DIR), demo["start"], demo["days"], demo["seed"])
    return _config()


def test_month_batches_follow_the_calendar_and_file_batches_are_single_files(
    edge_demo: dict[str, Any],
) -> None:
    batches = pipeline.feature_batches(edge_demo)
    stems = list(pipeline.raw_data_files(edge_demo))
    assert list(batches) == ["2024-02", "2024-03"] and [s for b in batches.values() for s in b] == stems
    assert [s[10:18] for s in batches["2024-02"]] == ["20240228", "20240229"]
    per_file = pipeline.feature_batches(_config("file"))
    assert per_file == {stem: [stem] for stem in stems}
    assert [pipeline.feature_rule_name(b) for b in batches] == ["features_2024_02", "features_2024_03"]
    assert {pipeline.rule_stage(pipeline.feature_rule_name(b)) for b in [*batches, *per_file]} == {"features"}
    with pytest.raises(ConfigError, match=r"^config key 'features.batch': ") as info:
        _config("week")
    assert "\n" not in str(info.value)


def test_a_batch_writes_the_same_bytes_as_one_job_per_file_across_the_month_edge(
    edge_demo: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    february, march = _jobs(edge_demo, tmp_path / "batch")
    assert not february[0].context_srcs  # the data's first file
    # the batch edge: March's first file has February's files as context, as it had with a job of its own
    assert [p.name for p in march[0].context_srcs] == [j.src.name for j in february]
    assert all(job.quote_srcs for job in february + march)  # data.quotes: demo
    reads: list[str] = []
    real = build.read_bars

    def counting(path: Path, *args: Any, **kwargs: Any) -> Any:
        reads.append(Path(path).name)
        return real(path, *args, **kwargs)

    (tmp_path / "batch").mkdir()
    monkeypatch.setattr(build, "read_bars", counting)
    summaries = build_feature_batch(march)
    # each file decoded once; February's only as the first file's context (a job per file decodes up to 4x)
    assert sorted(reads) == sorted({*reads}) and {j.src.name for j in march} <= set(reads)
    assert summaries[0]["context"] and summaries[0]["context"][-1]["file"] == february[-1].src.name
    build_feature_batch(february)
    monkeypatch.setattr(build, "read_bars", real)
    expected = _per_file(february + march, tmp_path / "per_file")
    got = {job.dst.name: job.dst.read_bytes() for job in february + march}
    assert got == expected
    assert all(pq.read_metadata(tmp_path / "batch" / name).num_rows > 0 for name in list(got)[-3:])


def test_a_batch_of_real_files_matches_and_skip_skips_only_the_bad_file(
    tmp_path: Path, dbn_samples: Path
) -> None:
    # The real ESH4 MBO sample and copies of it 1..3 days later, the third unreadable: one batch, each file
    # with the files before it as context (as pipeline.feature_batch_files gives them).
    src = dbn_samples / ESH4_MBO
    days = [damaged_copy(src, tmp_path / f"day{n}.mbo.dbn.zst", shift_days=n) for n in range(4)]
    days[2].write_bytes(b"not a DBN file")
    jobs = [
        FeatureJob(day, tmp_path / "batch" / f"day{n}.parquet", tuple(days[max(0, n - 3) : n]))
        for n, day in enumerate(days)
    ]
    (tmp_path / "batch").mkdir()
    with pytest.raises(DataFileError) as info:
        build_feature_batch(jobs, bar_size="1s")
    assert info.value.path == days[2] and "\n" not in str(info.value)
    assert not jobs[
        2
    ].dst.exists()  # nothing half-written of the failing file (the workflow removes the rest)

    summaries = build_feature_batch(jobs, bar_size="1s", on_bad_file="skip")
    assert [s["skipped"] is not None for s in summaries] == [False, False, True, False]
    assert skipped_reason(jobs[2].dst) and summaries[1]["rows"] > 0
    # day3's context ends at the bad file, as with a job of its own
    assert summaries[3]["context"] == []
    expected = _per_file(jobs, tmp_path / "per_file", bar_size="1s", on_bad_file="skip")
    assert {job.dst.name: job.dst.read_bytes() for job in jobs} == expected


def test_a_feature_table_still_gets_the_files_before_it_as_context(tmp_path: Path) -> None:
    # Monday 2024-03-11 of the tiny demo: its table's context is Thursday, Friday and the Sunday file
    # (pipeline.CONTEXT_FILES); the first file has none. Its batch's inputs hold them all.
    config = validate_config(yaml.safe_load(TINY.read_text()))
    files = pipeline.raw_data_files(config)
    stems = list(files)
    monday, first = stems[3], stems[0]
    assert monday.startswith("glbx-mdp3-20240311") and pipeline.CONTEXT_FILES == 3
    batches = pipeline.feature_batches(config)
    assert list(batches) == ["2024-03"]  # tiny: one month
    entries = {e["src"]: e for e in pipeline.feature_batch_files(files, batches["2024-03"], {})}
    assert entries[files[monday]]["context"] == [files[s] for s in stems[:3]]
    assert entries[files[first]]["context"] == []
    assert entries[files[monday]]["dst"] == paths.FEATURES.format(stem=monday)


# ------------------------------------------------------------------------------ the workflow (real Snakemake)


def _edge_workdir(tmp_path: Path) -> Path:
    config = yaml.safe_load(TINY.read_text())
    config["data"].update(EDGE_DEMO)
    return workdir_with_config(tmp_path, config)


def _planned(workdir: Path, *targets: str) -> dict[str, int]:
    """{rule: jobs} of a dry-run (rule names kept: which batch runs)."""
    result = snakemake("-n", *(targets or (paths.FEATURE_MANIFEST,)), "--quiet", "rules", cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    if "Job stats:" not in output:
        assert "Nothing to be done" in output, output[-2000:]
        return {}
    table = output.split("Job stats:")[1].split("\ntotal")[0]
    return {
        line.split()[0]: int(line.split()[1])
        for line in table.splitlines()[3:]
        if line.strip() and line.split()[1].isdigit()
    }


def _rewrite(path: Path) -> None:
    """A new version of `path` with the same records: recompressed, so its bytes (and mtime) change (Snakemake
    keeps an input's checksum and ignores a mere touch of a small file)."""
    data = zstandard.ZstdDecompressor().stream_reader(path.read_bytes()).read()
    path.write_bytes(zstandard.ZstdCompressor(level=19).compress(data))


def test_one_table_is_addressable_and_plans_only_its_batch(tmp_path: Path) -> None:
    workdir = _edge_workdir(tmp_path)
    config = validate_config(yaml.safe_load((workdir / "config.yaml").read_text()))
    march = pipeline.feature_batches(config)["2024-03"]
    assert _planned(workdir, paths.FEATURES.format(stem=march[-1])) == {"demo_data": 1, "features_2024_03": 1}
    assert job_counts(snakemake("-n", paths.FEATURE_MANIFEST, "--quiet", "rules", cwd=workdir).stdout) == {
        "demo_data": 1,
        "features": 2,
        "feature_manifest": 1,
    }


@pytest.mark.slow  # four Snakemake runs and five dry-runs (~60 s on 2 cores)
def test_a_changed_input_reruns_its_batch_and_a_failed_batch_leaves_no_table(tmp_path: Path) -> None:
    workdir = _edge_workdir(tmp_path)
    config = validate_config(yaml.safe_load((workdir / "config.yaml").read_text()))
    files = pipeline.raw_data_files(config)
    batches = pipeline.feature_batches(config)
    run = snakemake("--cores", "2", paths.FEATURE_MANIFEST, cwd=workdir)
    assert run.returncode == 0, run.stderr[-2000:]
    assert _planned(workdir) == {}
    # a March file that is no file's context across the edge: its batch alone (and the manifest)
    _rewrite(workdir / files[batches["2024-03"][-1]])
    assert _planned(workdir) == {"features_2024_03": 1, "feature_manifest": 1}
    # February's last file is also the context of March's first files: both batches
    _rewrite(workdir / files[batches["2024-02"][-1]])
    assert _planned(workdir) == {"features_2024_02": 1, "features_2024_03": 1, "feature_manifest": 1}
    run = snakemake("--cores", "2", paths.FEATURE_MANIFEST, cwd=workdir)
    assert run.returncode == 0, run.stderr[-2000:]

    # A bad file in the middle of March: the batch fails (data.on_bad_file: error) after writing the tables
    # before it, and Snakemake removes every table of the failed job; February's stay.
    tables = {stem: workdir / paths.FEATURES.format(stem=stem) for stem in files}
    before = {stem: path.read_bytes() for stem, path in tables.items()}
    bad = batches["2024-03"][1]
    shutil.copy(workdir / files[bad], tmp_path / "good.dbn.zst")
    (workdir / files[bad]).write_bytes(b"not a DBN file")
    failed = snakemake("--cores", "2", paths.FEATURE_MANIFEST, cwd=workdir)
    assert failed.returncode != 0 and files[bad] in failed.stderr  # the one-line error names the file
    assert not any(tables[stem].exists() for stem in batches["2024-03"])
    assert all(tables[stem].read_bytes() == before[stem] for stem in batches["2024-02"])

    # data.on_bad_file: skip: only the bad file is skipped; every other table is as before
    skip = yaml.safe_load((workdir / "config.yaml").read_text())
    skip["data"]["on_bad_file"] = "skip"
    (workdir / "config.yaml").write_text(yaml.safe_dump(skip))
    run = snakemake("--cores", "2", paths.FEATURE_MANIFEST, cwd=workdir)
    assert run.returncode == 0, run.stderr[-2000:]
    assert skipped_reason(tables[bad])
    others = [stem for stem in files if stem != bad and stem not in batches["2024-03"][2:5]]
    # the 3 files after the bad one lose the context behind it, as they would with a job each
    assert all(tables[stem].read_bytes() == before[stem] for stem in others)

    # features.batch: file reruns every table, one job each (the jobs' inputs change; stages.DAG_KEYS says so)
    skip.setdefault("features", {})["batch"] = "file"
    (workdir / "config.yaml").write_text(yaml.safe_dump(skip))
    per_file = {pipeline.feature_rule_name(stem): 1 for stem in files}
    assert _planned(workdir) == {**per_file, "feature_manifest": 1}
