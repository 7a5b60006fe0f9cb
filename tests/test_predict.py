"""The predict stage (docs/PREDICT.md): a finished run's models applied to new DBN files.

One cheap finished run (one fold, dqn and linear, two seeds, up to the evaluation outputs; quote-aware fills at
the demo's bbo-1m quotes) is shared by the module. A "held-back" file holding exactly the fold's test days
(re-encoded from the run's own demo files) must give, seed by seed and bar by bar, the positions and PnL that
evaluation gave on the same bars, its fills paired with the same quotes; a file of training
days (look-ahead) and one of another instrument fail in one line; a changed predict.files plans only predict jobs.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from pathlib import Path
from typing import Any

import databento_dbn as dbn
import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import torch
import yaml
import zstandard

from marketrl.data.dbn_writer import MappingInterval, SymbolMapping, encode_dbn, write_dbn
from marketrl.data.quotes import QUOTE_COLUMNS
from marketrl.env import EnvConfig, MarketData, evaluate_positions
from marketrl.evaluation.predict import (
    ENSEMBLE,
    PredictInputError,
    TrainedOn,
    check_new_file,
    ensemble_positions,
    mark_pending,
    read_provenance,
    with_stand_in_bars,
)
from marketrl.instruments.costs import costs_from_config
from marketrl.settings import paths
from marketrl.settings.config import ConfigError, validate_config
from marketrl.splits.datasets import feature_names_of
from marketrl.splits.folds import FoldPlan
from marketrl.splits.normalize import FeatureNormalizer
from tests.faults.pipeline import fast_tiny_config, new_workdir, snakemake_command
from tests.test_workflow import job_counts

MODELS = ["dqn", "linear"]
# quote-aware fills (the demo's bbo-1m quotes): predict pairs a new file with its days' quotes as training did
CONFIG = fast_tiny_config(training={"models": MODELS, "seeds": 2}, data={"quotes": "demo"})


def run(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        snakemake_command("--cores", "1", *args), cwd=workdir, capture_output=True, text=True, timeout=900
    )


def with_predict(workdir: Path, files: str) -> None:
    """Point the workdir's config.yaml at new files (predict.files)."""
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["predict"] = {"files": files}
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))


def decode(path: Path) -> tuple[Any, list[Any]]:
    """A DBN.zst file's metadata and records."""
    decoder = dbn.DBNDecoder()
    decoder.write(zstandard.ZstdDecompressor().stream_reader(path.read_bytes()).read())
    decoded = decoder.decode()
    return decoded[0], decoded[1:]


def write_span(sources: list[Path], out: Path, first_ns: int, last_ns: int, rename: dict[str, str]) -> None:
    """One DBN file with the records of `sources` stamped in [first_ns, last_ns], their symbology merged (a
    symbol renamed by `rename`): a file as a batch download of that span would hold."""
    records, intervals = [], {}
    for path in sources:
        metadata, file_records = decode(path)
        records += [r for r in file_records if first_ns <= r.ts_event <= last_ns]
        for symbol, spans in metadata.mappings.items():
            for span in spans:
                interval = MappingInterval(span["start_date"], span["end_date"], span["symbol"])
                intervals.setdefault(rename.get(symbol, symbol), []).append(interval)
    mappings = [SymbolMapping(symbol, spans) for symbol, spans in intervals.items()]
    data = encode_dbn(
        sorted(records, key=lambda r: (r.ts_event, r.instrument_id)),
        schema="ohlcv-1m",
        start_ns=first_ns,
        end_ns=last_ns + 60 * 10**9,
        mappings=mappings,
        dataset=metadata.dataset,
        stype_in="continuous",
    )
    write_dbn(out, data)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run finished up to every evaluation output (the report is not needed)."""
    workdir = new_workdir(CONFIG, tmp_path_factory.mktemp("predict"))
    targets = [
        paths.EVAL_BARS.format(model=model, fold=0, seed=seed)
        for model in MODELS
        for seed in (0, 1)[: 1 + (model == "dqn")]
    ]
    result = run(workdir, *targets)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return workdir


@pytest.fixture(scope="module")
def held_back(finished: Path) -> Path:
    """A new file of the fold's test days (after its last training day), from the run's own demo files."""
    plan = FoldPlan.load(finished / paths.FOLDS)
    test_days = pl.Series(plan.fold(0).test_days, dtype=pl.Date).implode()
    tables = pl.concat(
        [pl.read_parquet(p) for p in sorted((finished / "results/features").glob("*.parquet"))]
    )
    span = tables.filter(pl.col("trading_day").is_in(test_days))["ts_event"]
    out = finished / "new" / "held-back.ohlcv-1m.dbn.zst"
    out.parent.mkdir()
    sources = sorted((finished / paths.DEMO_DIR).glob("*.dbn.zst"))
    first, last = (int(ts.timestamp() * 10**9) for ts in (span.min(), span.max()))
    write_span(sources, out, first, last, {})
    return out


@pytest.mark.slow
def test_held_back_file_gives_evaluations_positions(finished: Path, held_back: Path) -> None:
    with_predict(finished, "new/*.dbn.zst")
    result = run(finished, "predict_all")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert job_counts(result.stdout + result.stderr) == {
        "predict_features": 1,
        "predict": len(MODELS),
        "predict_all": 1,
    }
    for model in MODELS:
        out = finished / paths.PREDICT.format(model=model, stem="held-back.ohlcv-1m")
        table = pl.read_parquet(out)
        seeds = (0, 1) if model == "dqn" else (0,)
        assert table["member"].unique().sort().to_list() == sorted([*(f"seed_{s}" for s in seeds), ENSEMBLE])
        for seed in seeds:
            evaluated = pl.read_parquet(finished / paths.EVAL_BARS.format(model=model, fold=0, seed=seed))
            member = table.filter(pl.col("member") == f"seed_{seed}")
            predicted = member.filter(~pl.col("pending")).select(evaluated.columns)
            assert predicted.height > 0 and predicted.equals(evaluated), model
            # ...fills included: the same quotes' half-spreads, the same fallbacks, the same costs
            assert evaluated["quote_fallback"].null_count() == 0  # evaluation filled at the demo's quotes
            # the file's last bar of each symbol: one pending decision, after evaluation's last row
            pending = member.filter(pl.col("pending"))
            assert sorted(pending["symbol"].to_list()) == sorted(evaluated["symbol"].unique().to_list())
            assert pending["net_return"].null_count() == pending["ts_event"].null_count() == pending.height
            settled = member.filter(~pl.col("pending"))
            for symbol, last in zip(pending["symbol"], pending["decision_ts_event"], strict=True):
                assert last > settled.filter(pl.col("symbol") == symbol)["decision_ts_event"].max()
        provenance = read_provenance(out)
        assert provenance["fold"] == 0 and len(provenance["checkpoints"]) == len(seeds)
        assert provenance["features"]["source_file"] == held_back.name
        assert provenance["costs"]["kind"]
    _same_fills_as_evaluation(finished)
    # A changed predict.files plans predict jobs only (the rest of the run is untouched).
    other = finished / "again"
    other.mkdir()
    shutil.copy(held_back, other / "held-back-copy.ohlcv-1m.dbn.zst")
    with_predict(finished, "again/*.dbn.zst")
    planned = run(finished, "-n", "predict_all", paths.EVAL_BARS.format(model="dqn", fold=0, seed=0))
    assert job_counts(planned.stdout + planned.stderr) == {
        "predict_features": 1,
        "predict": len(MODELS),
        "predict_all": 1,
    }


def _same_fills_as_evaluation(finished: Path) -> None:
    """The held-back file's feature table carries the quotes the training tables carry on the same bars, so a
    trader who trades at every bar pays the same spreads and costs in predict as in evaluation (the models above
    may stay flat under their gate)."""
    keys = ["instrument_id", "ts_event"]  # MarketData's row order
    new = pl.read_parquet(finished / paths.PREDICT_FEATURES.format(stem="held-back.ohlcv-1m")).sort(keys)
    assert (
        pq.read_schema(finished / paths.PREDICT_FEATURES.format(stem="held-back.ohlcv-1m")).metadata[
            b"marketrl.quotes"
        ]
        != b"null"
    )
    tables = pl.concat(
        [pl.read_parquet(p) for p in sorted((finished / "results/features").glob("*.parquet"))]
    )
    same_bars = tables.join(new.select(keys), on=keys, how="semi").sort(keys)
    assert same_bars.height == new.height > 0
    assert new.select(*keys, *QUOTE_COLUMNS).equals(same_bars.select(*keys, *QUOTE_COLUMNS))
    config = validate_config(CONFIG)
    costs = costs_from_config(config["costs"])
    fills = []
    for frame in (new, same_bars):
        names = feature_names_of(frame)
        data = MarketData.from_frame(frame, names, FeatureNormalizer().fit(frame, names), costs)
        flipping = (np.arange(data.n_rows) % 2 * 2 - 1).astype(np.float32)  # long, short, long, ...
        bars = evaluate_positions(data, flipping, EnvConfig(fill=config["env"]["fill"]))
        fills.append(bars.select("traded", "half_spread_ticks", "quote_fallback", "cost"))
    assert fills[0].equals(fills[1])
    assert fills[0]["cost"].sum() > 0 and (fills[0]["half_spread_ticks"] > 0.5).any()  # the quotes' spreads


@pytest.mark.slow
def test_pending_decision_is_the_one_made_once_the_next_bar_exists(finished: Path, held_back: Path) -> None:
    """A file cut at bar T (mid-session): its pending row is each model's decision at T, which must be the
    position the same models take at T in the file that goes on past T (a decision at T reads nothing after T)."""
    tables = pl.concat(
        [pl.read_parquet(p) for p in sorted((finished / "results/features").glob("*.parquet"))]
    )
    plan = FoldPlan.load(finished / paths.FOLDS)
    last_day = tables.filter(pl.col("trading_day").is_in(plan.fold(0).test_days))["trading_day"].max()
    day = tables.filter(pl.col("trading_day") == last_day)
    n_symbols = day["symbol"].n_unique()
    everyone = day.group_by("ts_event").len().filter(pl.col("len") == n_symbols)["ts_event"].sort()
    # T: every symbol trades at T and one bar later, so in the longer file bar T is a decision bar
    both = everyone.filter(everyone.dt.offset_by("1m").is_in(everyone.implode()))
    cut_at = both[both.len() // 2]
    directory = finished / "pending"
    directory.mkdir()
    shutil.copy(held_back, directory / "full.ohlcv-1m.dbn.zst")
    first_ns = int(decode(held_back)[1][0].ts_event)
    sources = sorted((finished / paths.DEMO_DIR).glob("*.dbn.zst"))
    write_span(sources, directory / "cut.ohlcv-1m.dbn.zst", first_ns, int(cut_at.timestamp() * 10**9), {})
    with_predict(finished, "pending/*.dbn.zst")
    result = run(finished, "predict_all")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    for model in MODELS:
        full, cut = (
            pl.read_parquet(finished / paths.PREDICT.format(model=model, stem=f"{stem}.ohlcv-1m"))
            for stem in ("full", "cut")
        )
        pending = cut.filter(pl.col("pending"))
        assert pending.height == n_symbols * full["member"].n_unique(), model
        assert (pending["decision_ts_event"] == cut_at).all()
        assert pending["net_return"].null_count() == pending.height
        keys = ["member", "symbol", "decision_ts_event"]
        later = full.filter(pl.col("decision_ts_event") == cut_at).select(*keys, full_position="position")
        assert later.height == pending.height and not later["full_position"].is_null().any()
        matched = pending.join(later, on=keys, how="inner")
        assert matched.height == pending.height
        assert matched["position"].equals(matched["full_position"], check_names=False), model
        # before T both files are the same trader, bar for bar
        settled = cut.filter(~pl.col("pending")).drop("pending")
        earlier = full.filter(pl.col("decision_ts_event") < cut_at).drop("pending")
        assert settled.height > 0 and settled.sort(keys).equals(earlier.sort(keys)), model


@pytest.mark.slow
def test_a_file_of_training_days_is_look_ahead(finished: Path) -> None:
    early = finished / "early"
    early.mkdir()
    last_train_day = FoldPlan.load(finished / paths.FOLDS).fold(0).last_train_day
    # the demo file of the UTC day of the last training day: its rows are training rows
    source = finished / paths.DEMO_DIR / f"glbx-mdp3-{last_train_day:%Y%m%d}.ohlcv-1m.dbn.zst"
    shutil.copy(source, early / source.name)
    with_predict(finished, "early/*.dbn.zst")
    result = run(finished, paths.PREDICT.format(model="linear", stem=source.name.removesuffix(".dbn.zst")))
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "look-ahead" in line]
    assert lines and lines[0].strip().startswith("marketrl error: PredictInputError:"), result.stderr[-3000:]
    assert source.name in lines[0] and str(last_train_day) in lines[0]


@pytest.mark.slow
def test_a_file_relabelling_an_instrument_fails_in_one_line(finished: Path, held_back: Path) -> None:
    """ES's records under CL's name (the same instrument id) stop in the file's features job: one id keeps one
    symbol root across files (marketrl.data.labels). A file of another instrument under its own id meets the
    predict job's check instead (`test_check_new_file_names_the_file_and_what_the_model_was_trained_on`)."""
    other = finished / "other"
    other.mkdir()
    _, records = decode(held_back)
    out = other / "crude.ohlcv-1m.dbn.zst"
    write_span([held_back], out, records[0].ts_event, records[-1].ts_event, {"ES.c.0": "CL.c.0"})
    with_predict(finished, "other/*.dbn.zst")
    result = run(finished, paths.PREDICT.format(model="dqn", stem="crude.ohlcv-1m"))
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "DataFileError" in line]
    assert lines and lines[0].strip().startswith("marketrl error: DataFileError:"), result.stderr[-3000:]
    assert "crude.ohlcv-1m.dbn.zst: instrument" in lines[0] and "is CL.c.0 here but ES.c.0" in lines[0]


def _bars(symbol: str, instrument: int, minutes: list[int]) -> pl.DataFrame:
    start = dt.datetime(2024, 3, 12, 14, 0, tzinfo=dt.UTC)
    return pl.DataFrame(
        {
            "ts_event": [start + dt.timedelta(minutes=m) for m in minutes],
            "trading_day": [dt.date(2024, 3, 12)] * len(minutes),
            "symbol": [symbol] * len(minutes),
            "instrument_id": [instrument] * len(minutes),
            "close": [100.0 + m for m in minutes],
        }
    ).with_columns(pl.col("ts_event").dt.cast_time_unit("ns"))


def test_stand_in_bars_follow_each_series_still_trading_at_the_end() -> None:
    rows = pl.concat([_bars("ESM4", 1, [0, 1, 2, 3]), _bars("NQM4", 2, [0, 2, 4]), _bars("CLK4", 3, [0, 1])])
    extended, stand_ins = with_stand_in_bars(rows, dt.timedelta(minutes=2))
    # CL's last bar is 3 minutes before the file's end (4): no longer trading, no stand-in
    assert stand_ins.sort("symbol").rows() == [
        ("ESM4", dt.datetime(2024, 3, 12, 14, 4, tzinfo=dt.UTC)),
        ("NQM4", dt.datetime(2024, 3, 12, 14, 5, tzinfo=dt.UTC)),  # one step: the table's smallest
    ]
    added = extended.join(rows, on=["instrument_id", "ts_event"], how="anti")
    assert added.height == 2 and added["close"].to_list() == [103.0, 104.0]  # copies of the last bars
    assert extended.join(added, on=["instrument_id", "ts_event"], how="anti").equals(rows)
    assert extended.equals(extended.sort("instrument_id", "ts_event"))  # MarketData's row order
    # without max_gap: every series trading on the last trading day
    assert with_stand_in_bars(rows, None)[1].height == 3


def test_pending_rows_null_what_the_next_bar_would_tell() -> None:
    ts = [dt.datetime(2024, 3, 12, 14, m, tzinfo=dt.UTC) for m in range(5)]
    bars = pl.DataFrame(
        {
            "decision_ts_event": ts[:4],
            "ts_event": ts[1:],
            "trading_day": [dt.date(2024, 3, 12)] * 4,
            "symbol": ["ESM4"] * 4,
            "position": [1, 1, -1, 0],
            "gross_return": [0.1, 0.2, 0.3, 0.4],
            "cost": [0.0] * 4,
            "net_return": [0.1, 0.2, 0.3, 0.4],
            "forward_return": [0.5, 0.6, 0.7, 0.8],
        }
    )
    stand_ins = pl.DataFrame({"symbol": ["ESM4"], "ts_event": [ts[4]]})
    marked = mark_pending(bars, stand_ins, horizon=2)
    assert marked["pending"].to_list() == [False, False, False, True]
    assert marked["position"].to_list() == [1, 1, -1, 0]  # the decision itself is known
    assert marked["net_return"].to_list() == [0.1, 0.2, 0.3, None]
    assert marked["ts_event"].null_count() == marked["trading_day"].null_count() == 1
    # horizon 2: bar t+2 of the last two decisions is the stand-in
    assert marked["forward_return"].to_list() == [0.5, 0.6, None, None]


def test_ensemble_is_the_majority_else_flat() -> None:
    positions = torch.tensor(
        [[1.0, 1.0, -1.0, 1.0, 0.0, 2.0], [1.0, 0.0, -1.0, -1.0, 0.0, 2.0], [0.0, 0.0, 1.0, 0.0, 0.0, 2.0]]
    )
    assert ensemble_positions(positions).tolist() == [1.0, 0.0, -1.0, 0.0, 0.0, 2.0]
    # two seeds: a majority is both of them
    assert ensemble_positions(positions[:2]).tolist() == [1.0, 0.0, -1.0, 0.0, 0.0, 2.0]


def test_predict_keys_are_checked_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"config key 'predict.models': 'ppo' is not trained"):
        validate_config({"training": {"models": ["dqn"]}, "predict": {"models": ["ppo"]}})
    with pytest.raises(ConfigError, match=r"config key 'predict.fold': no fold 3 \(folds.n is 3"):
        validate_config({"predict": {"fold": 3}})
    assert validate_config({})["predict"] == {"files": "", "models": [], "fold": -1}


def test_predict_files_glob_matching_nothing_fails_at_parse(tmp_path: Path) -> None:
    workdir = new_workdir({**CONFIG, "predict": {"files": str(tmp_path / "none" / "*.dbn.zst")}}, tmp_path)
    result = run(workdir, "-n", "predict_all")
    assert result.returncode == 1
    assert "marketrl config error: config key 'predict.files': glob" in result.stderr
    assert "Traceback" not in result.stderr


def _table(
    path: Path, schema: str, bar_size: str, symbols: list[str], day: dt.date, **extra: str
) -> pl.DataFrame:
    """A minimal feature table with the metadata the features stage writes (``extra``: more of it)."""
    rows = pl.DataFrame({"trading_day": [day] * len(symbols), "symbol": symbols})
    metadata = {
        "marketrl.source_file": "new.dbn.zst",
        "marketrl.dataset": "GLBX.MDP3",
        "marketrl.schema": schema,
        "marketrl.bar_size": bar_size,
        **{f"marketrl.{key}": value for key, value in extra.items()},
    }
    pq.write_table(rows.to_arrow().replace_schema_metadata(metadata), path)
    return rows


def test_check_new_file_names_the_file_and_what_the_model_was_trained_on(tmp_path: Path) -> None:
    trained = TrainedOn(
        {"dataset": "GLBX.MDP3", "schema": "ohlcv-1m", "bar_size": "1m"},
        ("ES", "NQ"),
        dt.date(2024, 3, 12),
        2,
    )
    path = tmp_path / "new.parquet"
    check_new_file(
        path, _table(path, "ohlcv-1m", "1m", ["ESM4", "NQ.c.0"], dt.date(2024, 3, 13)), trained, "dqn"
    )
    with pytest.raises(
        PredictInputError,
        match=r"^new.dbn.zst: holds GLBX.MDP3 ohlcv-1s \(bar size 5m\) bars, the "
        r"dqn models of fold 2 were trained on GLBX.MDP3 ohlcv-1m \(bar size 1m\)$",
    ):
        check_new_file(path, _table(path, "ohlcv-1s", "5m", ["ESM4"], dt.date(2024, 3, 13)), trained, "dqn")
    with pytest.raises(PredictInputError, match=r"no model for CL\)$"):
        check_new_file(
            path, _table(path, "ohlcv-1m", "1m", ["CLM4", "ESM4"], dt.date(2024, 3, 13)), trained, "dqn"
        )
    with pytest.raises(PredictInputError, match=r"starts on trading day 2024-03-12, on or before 2024-03-12"):
        check_new_file(path, _table(path, "ohlcv-1m", "1m", ["ESM4"], dt.date(2024, 3, 12)), trained, "dqn")
    with pytest.raises(PredictInputError, match=r"no feature rows to predict"):
        check_new_file(path, _table(path, "ohlcv-1m", "1m", [], dt.date(2024, 3, 13)), trained, "dqn")


def test_check_new_file_wants_quotes_where_evaluation_had_them(tmp_path: Path) -> None:
    quoted = TrainedOn(
        {"dataset": "GLBX.MDP3", "schema": "ohlcv-1m", "bar_size": "1m", "quotes": '["a.bbo-1s.dbn.zst"]'},
        ("ES",),
        dt.date(2024, 3, 12),
        0,
    )
    path, day = tmp_path / "new.parquet", dt.date(2024, 3, 13)
    check_new_file(
        path, _table(path, "ohlcv-1m", "1m", ["ESM4"], day, quotes='["b.bbo-1s.dbn.zst"]'), quoted, "dqn"
    )
    for metadata in ({}, {"quotes": "null"}):
        with pytest.raises(
            PredictInputError,
            match=r"^new.dbn.zst: has no quotes, the dqn models of fold 0 were evaluated with quote-aware fills",
        ):
            check_new_file(path, _table(path, "ohlcv-1m", "1m", ["ESM4"], day, **metadata), quoted, "dqn")
    with pytest.raises(
        PredictInputError, match=r"^new.dbn.zst: quotes joined with env.fill_delay 2, .* with 0$"
    ):
        table = _table(path, "ohlcv-1m", "1m", ["ESM4"], day, quotes='["b.bbo-1s.dbn.zst"]', fill_delay="2")
        check_new_file(path, table, quoted, "dqn")
    unquoted = TrainedOn({**quoted.data, "quotes": "null"}, ("ES",), dt.date(2024, 3, 12), 0)
    with pytest.raises(
        PredictInputError, match=r"carries quotes, .* were evaluated without quote-aware fills"
    ):
        check_new_file(
            path, _table(path, "ohlcv-1m", "1m", ["ESM4"], day, quotes='"mbp-1 book"'), unquoted, "dqn"
        )


def test_default_models_are_the_reports_winners_else_all(tmp_path: Path) -> None:
    from marketrl.workflow.pipeline import predict_models

    config = validate_config({"training": {"models": ["dqn", "ppo", "linear"]}})
    verdict = tmp_path / "verdict.json"
    assert predict_models(config, str(verdict)) == ["dqn", "ppo", "linear"]  # no report yet: every model
    verdict.write_text('{"winners": ["linear", "ppo"]}', encoding="utf-8")
    assert predict_models(config, str(verdict)) == ["ppo", "linear"]  # in training.models order
    verdict.write_text('{"winners": []}', encoding="utf-8")
    assert predict_models(config, str(verdict)) == ["dqn", "ppo", "linear"]  # no winner: every model
    named = validate_config({"training": {"models": ["dqn", "ppo"]}, "predict": {"models": ["dqn"]}})
    assert predict_models(named, str(verdict)) == ["dqn"]  # predict.models wins over the verdict
    verdict.write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"predict\.models.*verdict\.json"):
        predict_models(config, str(verdict))
