"""The report's data section from the feature manifest: rolls, skipped and warm-up-only files, bars dropped
in the halt and a file-name order that disagrees with the data's time order."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from marketrl.report import ReportInputError, build_report
from tests.report_fixtures import PipelineOutputs, write_pipeline_outputs

ROLL = {
    "symbol": "ES.c.0",
    "trading_day": "2024-03-15",
    "old_instrument_id": 11,
    "new_instrument_id": 5,
    "old_last_bar": "2024-03-14T23:59:00+00:00",
    "new_first_bar": "2024-03-15T01:43:00+00:00",
}


def _entry(
    name: str,
    *,
    halt: int | None,
    outside: int | None,
    skipped: str | None = None,
    warmup_only: str | None = None,
) -> dict[str, object]:
    return {
        "path": f"results/features/{name}.parquet",
        "sha256": "0" * 64,
        "rows": 0 if skipped or warmup_only else 100,
        "source_file": f"{name}.dbn.zst",
        "dropped_in_halt": halt,
        "dropped_outside_session": outside,
        "skipped": skipped,
        "warmup_only": warmup_only,
    }


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> PipelineOutputs:
    return write_pipeline_outputs(tmp_path_factory.mktemp("data") / "run", n_folds=2, models=("ppo",))


def _data_section(outputs: PipelineOutputs, out: Path, manifest: dict[str, object] | None) -> str:
    kwargs = outputs.report_kwargs(out)
    if manifest is not None:
        path = out.with_name("manifest.json")
        path.write_text(json.dumps(manifest))
        kwargs["manifest_path"] = str(path)
    build_report(**kwargs)
    html = out.read_text(encoding="utf-8")
    return html[html.index('<section id="data">') : html.index('<section id="provenance">')]


def test_data_section_lists_rolls_skipped_files_and_halt_drops(
    outputs: PipelineOutputs, tmp_path: Path
) -> None:
    manifest = {
        "files": [
            # A download starting on a Sunday: its 60 bars are all warm-up, context for Monday only.
            _entry("glbx-mdp3-20240310", halt=0, outside=0, warmup_only="all 60 bars are warm-up (...)"),
            _entry("glbx-mdp3-20240314", halt=60, outside=60),
            _entry("glbx-mdp3-20240315", halt=58, outside=118),
            # An unreadable header under data.on_bad_file: skip: the features job recorded no counts.
            _entry("glbx-mdp3-20240318", halt=None, outside=None, skipped="not a valid DBN stream (...)"),
        ],
        "rolls": [ROLL],
        "name_order": {"file": "01-04-2024.dbn.zst", "after": "29-03-2024.dbn.zst"},
    }
    section = _data_section(outputs, tmp_path / "eval_report.html", manifest)
    order = re.search(r'data-metric="name-order" data-value="disagrees">([^<]*)<', section)
    assert order and "01-04-2024.dbn.zst holds later data than 29-03-2024.dbn.zst" in order.group(1)
    assert re.search(r'data-metric="input-files" data-value="4"', section)
    assert re.search(r'data-metric="skipped-files" data-value="1"', section)
    assert re.search(r'data-metric="warmup-only-files" data-value="1"', section)
    warmup = re.search(r'<tr data-warmup-only="glbx-mdp3-20240310.dbn.zst">(.*?)</tr>', section)
    assert warmup and "all 60 bars are warm-up" in warmup.group(1)
    assert 'data-skipped="glbx-mdp3-20240310.dbn.zst"' not in section  # warm-up only is not a bad file
    assert 'data-metric="dropped-in-halt" data-value="118"' in section and "178 in all" in section
    roll = re.search(r'<tr data-roll="ES.c.0" data-day="2024-03-15">(.*?)</tr>', section)
    assert roll and "11 → 5" in roll.group(1) and "2024-03-15T01:43:00+00:00" in roll.group(1)
    skipped = re.search(r'<tr data-skipped="glbx-mdp3-20240318.dbn.zst">(.*?)</tr>', section)
    assert skipped and "not a valid DBN stream" in skipped.group(1)
    halts = re.findall(r'<tr data-file="([^"]+)">.*?data-metric="file-in-halt" data-value="(\d+)"', section)
    assert halts == [
        ("glbx-mdp3-20240310.dbn.zst", "0"),
        ("glbx-mdp3-20240314.dbn.zst", "60"),
        ("glbx-mdp3-20240315.dbn.zst", "58"),
    ]


def test_data_section_without_rolls_or_manifest_says_so(outputs: PipelineOutputs, tmp_path: Path) -> None:
    plain = _data_section(
        outputs, tmp_path / "a.html", {"files": [_entry("d", halt=0, outside=0)], "rolls": []}
    )
    assert "none (no continuous symbol changed contract)" in plain and "data-roll=" not in plain
    assert "data-skipped=" not in plain and "data-warmup-only=" not in plain and "warm-up only" not in plain
    assert 'data-metric="name-order" data-value="agrees"' in plain  # no name_order key: an older manifest
    assert "not recorded (no feature manifest given)" in _data_section(outputs, tmp_path / "b.html", None)


def test_malformed_manifest_is_named(outputs: PipelineOutputs, tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"files": [{"rows": 3}]}))
    kwargs = outputs.report_kwargs(tmp_path / "eval_report.html") | {"manifest_path": str(path)}
    with pytest.raises(ReportInputError, match=r"manifest\.json: feature manifest: 'files' must be a list"):
        build_report(**kwargs)
    assert not (tmp_path / "eval_report.html").exists()


def test_malformed_name_order_is_named(outputs: PipelineOutputs, tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"files": [_entry("d", halt=0, outside=0)], "name_order": "yes"}))
    kwargs = outputs.report_kwargs(tmp_path / "eval_report.html") | {"manifest_path": str(path)}
    with pytest.raises(
        ReportInputError, match=r"manifest\.json: feature manifest: 'name_order' must be null"
    ):
        build_report(**kwargs)
    assert not (tmp_path / "eval_report.html").exists()
