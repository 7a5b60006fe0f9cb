"""The validation gate (marketrl.scoring.gate): a run trades on the test days only where its validation days show
an edge after costs. Unit checks of the decision, then the train and evaluate jobs carrying it end to end: the
checkpoint, train_log.json and metrics.json record it, a run set flat trades nothing on its test days, the gate
changes no weights, and it reads no test day."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import polars as pl
import pytest
import torch

from marketrl.env import EnvConfig
from marketrl.evaluation.evaluate import evaluate_job, read_test_records, walk_forward_record
from marketrl.instruments.costs import CostModel
from marketrl.scoring.batched import bar_net_returns
from marketrl.scoring.gate import (
    POOLED,
    RECORD,
    VALIDATION,
    FoldRecord,
    GateDecision,
    flat_gates,
    gated_positions,
    record_gate,
    record_or_pooled,
)
from marketrl.splits.datasets import write_feature_manifest
from marketrl.splits.folds import FoldPlan, make_fold_plan
from marketrl.training.train import train_job
from tests.support.runs import TWO_FOLDS, synthetic_job_inputs
from tests.test_env import market_data, random_frame
from tests.test_zoo import HPARAMS

CHEAP = CostModel(kind="bps", bps=0.5)


@pytest.fixture(scope="module")
def data():
    frame = random_frame(n_instruments=2, days=6, bars_per_day=30, seed=3, drop=0.0)
    return market_data(frame, CHEAP)


def next_bar_sign(data) -> torch.Tensor:
    """sign(close[t+1] / close[t] − 1): a trader that knows the next bar (a real edge, for the gate only)."""
    close = data.close.double()
    forward = torch.cat([close[1:] / close[:-1] - 1.0, close.new_zeros(1)])
    return torch.sign(forward).to(torch.float32)


def test_a_trader_with_an_edge_keeps_trading_and_one_that_only_pays_costs_is_set_flat(data) -> None:
    config = EnvConfig(max_gap=data.max_gap)
    generator = torch.Generator().manual_seed(0)
    churner = torch.randint(-1, 2, (data.n_rows,), generator=generator).to(torch.float32)
    edge, noise = flat_gates(data, torch.stack([next_bar_sign(data), churner]), config, min_t=1.0)
    assert not edge.set_flat and edge.t_stat > 5 and edge.net_sharpe > 0
    assert noise.set_flat and noise.t_stat < 1.0
    assert noise.gross_sharpe > noise.net_sharpe  # the costs it pays are the gap
    assert edge.turnover > 0 and edge.n_days == 6 and edge.n_bars > 0
    assert edge.min_t == 1.0


def test_the_threshold_decides_and_a_run_flat_on_validation_has_no_evidence(data) -> None:
    config = EnvConfig(max_gap=data.max_gap)
    positions = torch.stack([next_bar_sign(data), torch.zeros(data.n_rows)])
    (edge, flat) = flat_gates(data, positions, config, min_t=1.0)
    (strict, _) = flat_gates(data, positions, config, min_t=edge.t_stat + 1.0)
    assert not edge.set_flat and strict.set_flat  # the same run, a threshold above its t-statistic
    assert flat.set_flat and math.isnan(flat.t_stat) and flat.turnover == 0


def test_the_pooled_t_is_the_seeds_mean_portfolios_and_decides_for_every_seed_when_asked(data) -> None:
    config = EnvConfig(max_gap=data.max_gap)
    generator = torch.Generator().manual_seed(1)
    edge = next_bar_sign(data)
    # a seed that takes the edge on a random 60% of the bars, one on 40%, one that only churns
    partial = [
        torch.where(torch.rand(data.n_rows, generator=generator) < share, edge, 0.0) for share in (0.6, 0.4)
    ]
    churner = torch.randint(-1, 2, (data.n_rows,), generator=generator).to(torch.float32)
    positions = torch.stack([*partial, churner])
    own = flat_gates(data, positions, config, min_t=1.0)
    pooled = flat_gates(data, positions, config, min_t=1.0, pooled=True)
    # the pooled t: the three seeds' mean net bar return, computed here from each seed alone
    bars = np.stack([bar_net_returns(data, positions[k : k + 1], config)[0] for k in range(3)]).mean(0)
    expected = bars.mean() / bars.std(ddof=1) * math.sqrt(bars.size)
    assert all(d.pooled_t == pytest.approx(expected, rel=1e-9) for d in own + pooled)
    assert [d.t_stat for d in own] == [d.t_stat for d in pooled]  # each run's own t, recorded either way
    assert [d.set_flat for d in own] == [False, False, True] and {d.basis for d in own} == {VALIDATION}
    assert [d.set_flat for d in pooled] == [False] * 3 and {d.basis for d in pooled} == {POOLED}
    # one run alone: its pooled t is its own
    (alone,) = flat_gates(data, churner[None], config, min_t=1.0)
    assert alone.pooled_t == pytest.approx(alone.t_stat, rel=1e-9)
    # a batch that never trades has no evidence either way
    assert all(
        math.isnan(d.pooled_t) and d.set_flat
        for d in flat_gates(data, torch.zeros(2, data.n_rows), config, 1.0, pooled=True)
    )


def _validation_gate(own_t: float, pooled_t: float) -> GateDecision:
    return GateDecision(own_t < 1.5, own_t, 1.5, 1.0, 2.0, 10.0, 400, 2, VALIDATION, pooled_t)


def test_a_failed_record_yields_to_the_folds_seeds_pooled_validation_and_only_to_that() -> None:
    failed = record_gate(
        [FoldRecord.of_seeds(["2024-01-02", "2024-01-03"], [[-1.0, 0.5]], [[0, 1]], [3.0], 10)], 1.0
    )
    passed = dataclasses.replace(failed, set_flat=False, t_stat=2.0)
    assert failed.set_flat
    strong = [_validation_gate(t, 2.1) for t in (0.4, 2.6)]  # one seed alone would fail: the pooled t decides
    weak = [_validation_gate(t, 1.2) for t in (0.4, 2.6)]
    # fold 0 (no record): each run's own validation gate
    assert record_or_pooled(None, strong, 1.5) == strong
    # a record that passes decides, whatever the validation says
    assert record_or_pooled(passed, weak, 1.5) == [passed, passed]
    # a failed record: every seed trades when the pooled t reaches the threshold, none when it does not
    rescued = record_or_pooled(failed, strong, 1.5)
    assert [g.set_flat for g in rescued] == [False, False] and {g.basis for g in rescued} == {POOLED}
    assert [g.t_stat for g in rescued] == [0.4, 2.6] and {g.min_t for g in rescued} == {1.5}
    assert record_or_pooled(failed, weak, 1.5) == [failed, failed]
    # no threshold (the gate switched off), or a run without a validation gate: the record alone
    assert record_or_pooled(failed, strong, None) == [failed, failed]
    assert record_or_pooled(failed, [strong[0], None], 1.5) == [failed, failed]


def test_gated_positions_are_flat_only_when_set_flat(data) -> None:
    positions = next_bar_sign(data)
    config = EnvConfig(max_gap=data.max_gap)
    (decision,) = flat_gates(data, positions[None], config, min_t=1.0)
    assert torch.equal(gated_positions(positions, decision), positions)
    assert torch.equal(gated_positions(positions, None), positions)
    flat = GateDecision.from_dict({**decision.to_dict(), "set_flat": True})
    assert flat is not None and not gated_positions(positions, flat).any()
    assert GateDecision.from_dict(None) is None and GateDecision.from_dict({"t_stat": 1.0}) is None


# ------------------------------------------------------------------------------------- the jobs, end to end


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("gate")
    frame, manifest, folds, config = synthetic_job_inputs(root, n_instruments=2)
    config["env"].update(window=2, episode_length=16)
    config["training"].update(
        total_steps=256, n_envs=4, checkpoint_every=10_000, max_updates=20, check_every=5
    )
    return {"root": root, "frame": frame, "config": config, "manifest": str(manifest), "folds": str(folds)}


def run_jobs(inputs: dict, model: str, name: str, min_t: float | None, manifest: str | None = None) -> dict:
    """Train and evaluate `model` on fold 0 with the gate at `min_t`; the outputs."""
    out = inputs["root"] / name
    out.mkdir()
    config = json.loads(json.dumps(inputs["config"]))
    config["training"]["gate_min_t"] = min_t
    hparams = out / "hparams.json"
    hparams.write_text(json.dumps({"algo": model, "best_params": HPARAMS[model]}), encoding="utf-8")
    paths = {"manifest_path": manifest or inputs["manifest"], "folds_path": inputs["folds"]}
    (train_log,) = train_job(
        model=model,
        fold=0,
        seed_indices=[0],
        hparams_path=str(hparams),
        config=config,
        model_paths=[str(out / "model.pt")],
        log_paths=[str(out / "train_log.json")],
        resume_path=str(out / "resume.pt"),
        **paths,
    )
    (metrics,) = evaluate_job(
        model=model,
        fold=0,
        seed_indices=[0],
        model_paths=[str(out / "model.pt")],
        config=config,
        metrics_paths=[str(out / "metrics.json")],
        bars_paths=[str(out / "bars.parquet")],
        **paths,
    )
    checkpoint = torch.load(out / "model.pt", map_location="cpu", weights_only=True)
    return {
        "train_log": train_log,
        "metrics": metrics,
        "bars": pl.read_parquet(out / "bars.parquet"),
        "checkpoint": checkpoint,
    }


def weights(checkpoint: dict) -> list[torch.Tensor]:
    state = checkpoint.get("state_dicts") or checkpoint.get("state") or {}
    leaves: list[torch.Tensor] = []

    def walk(value: object) -> None:
        if isinstance(value, torch.Tensor):
            leaves.append(value)
        elif isinstance(value, dict):
            for key in sorted(value):
                walk(value[key])

    walk(state)
    return leaves


@pytest.mark.parametrize("model", ["linear", "dqn"])
def test_a_run_set_flat_trades_nothing_and_says_so_everywhere(inputs: dict, model: str) -> None:
    # one threshold no run can reach, and none at all: the same seed trains the same weights either way
    gated = run_jobs(inputs, model, f"{model}-gated", min_t=1e9)
    free = run_jobs(inputs, model, f"{model}-free", min_t=None)
    record = gated["train_log"]["flat_gate"]
    assert record["set_flat"] is True and record["min_t"] == 1e9
    assert gated["checkpoint"]["extra"]["flat_gate"]["set_flat"] is True
    assert gated["metrics"]["flat_gate"]["set_flat"] is True
    assert not gated["bars"]["position"].abs().sum()  # nothing traded on the test days
    assert gated["metrics"]["metrics"]["avg_daily_turnover"] == 0
    assert "flat_gate" not in free["train_log"] and "flat_gate" not in free["metrics"]
    assert "flat_gate" not in free["checkpoint"]["extra"]
    for a, b in zip(weights(gated["checkpoint"]), weights(free["checkpoint"]), strict=True):
        assert torch.equal(a, b)
    assert weights(gated["checkpoint"])


def test_the_gate_reads_no_test_day(inputs: dict) -> None:
    """Perturbing every test day's prices and features changes nothing the gate decided."""
    first = run_jobs(inputs, "linear", "linear-lookahead-a", min_t=-1e9)
    test_days = {str(day) for day in FoldPlan.load(inputs["folds"]).fold(0).test_days}
    frame = inputs["frame"]
    on_test = pl.col("trading_day").cast(pl.String).is_in(sorted(test_days))
    rng = np.random.default_rng(1)
    factor = pl.Series(np.exp(rng.normal(0.0, 0.2, frame.height)))  # positive: prices stay prices
    floats = [c for c, dtype in frame.schema.items() if dtype in (pl.Float32, pl.Float64)]
    perturbed = frame.with_columns(
        pl.when(on_test).then(pl.col(c) * factor).otherwise(pl.col(c)).cast(frame.schema[c]) for c in floats
    )
    assert not perturbed.equals(frame)
    table = inputs["root"] / "perturbed.parquet"
    perturbed.write_parquet(table)
    manifest = inputs["root"] / "perturbed_manifest.json"
    write_feature_manifest([table], manifest)
    second = run_jobs(inputs, "linear", "linear-lookahead-b", min_t=-1e9, manifest=str(manifest))
    assert first["train_log"]["flat_gate"] == second["train_log"]["flat_gate"]
    assert not first["bars"].equals(second["bars"])  # the test days did change


# ------------------------------------------------------------------------------ the walk-forward record


def test_the_record_gate_trades_an_earning_record_and_sets_a_costly_one_flat() -> None:
    rng = np.random.default_rng(0)
    days = tuple(f"2024-03-{d:02d}" for d in range(1, 21))
    earning = rng.normal(0.002, 0.003, 20)
    costly = rng.normal(-0.002, 0.003, 20)

    def record(net: np.ndarray) -> FoldRecord:
        return FoldRecord(days, tuple(net), tuple(net + 0.001), turnover=5.0, n_bars=400)

    trade, flat = record_gate([record(earning)], 1.0), record_gate([record(costly)], 1.0)
    assert not trade.set_flat and trade.basis == RECORD and trade.n_days == 20 and trade.t_stat > 1
    assert flat.set_flat and flat.t_stat < 0 and flat.gross_sharpe > flat.net_sharpe
    expected_t = earning.mean() / earning.std(ddof=1) * math.sqrt(20)
    assert trade.t_stat == pytest.approx(expected_t)
    # two folds' records pool their days; a record that never traded (no variation) has no evidence
    assert record_gate([record(earning), record(earning)], 1.0).n_days == 40
    assert record_gate([record(np.zeros(20))], 1.0).set_flat
    assert GateDecision.from_dict(trade.to_dict()) == trade


def _metrics(path, fold: int, days: list[str], net: list[float]) -> str:
    block = {
        "days": days,
        "daily_net_returns": net,
        "daily_gross_returns": [x + 0.001 for x in net],
        "avg_daily_turnover": 3.0,
        "n_bars": 48,
    }
    path.write_text(json.dumps({"fold": fold, "ungated": block}), encoding="utf-8")
    return str(path)


def test_the_record_is_the_seeds_mean_per_fold_and_never_holds_a_day_it_decides(tmp_path) -> None:
    days = ["2024-03-04", "2024-03-05"]
    paths = [
        _metrics(tmp_path / "a.json", 0, days, [0.01, -0.02]),
        _metrics(tmp_path / "b.json", 0, days, [0.03, 0.0]),
    ]
    (record,) = read_test_records(paths)
    assert record.daily_net == pytest.approx((0.02, -0.01)) and record.days == tuple(days)
    decision = walk_forward_record(paths, 1.0, ["2024-03-06"])
    assert decision is not None and decision.basis == RECORD and decision.n_days == 2
    assert walk_forward_record(paths, None, ["2024-03-06"]) is None  # record_min_t null: validation decides
    assert walk_forward_record([], 1.0, ["2024-03-06"]) is None  # the first fold: no record yet
    with pytest.raises(ValueError, match="2024-03-05 is not before"):
        walk_forward_record(paths, 1.0, ["2024-03-05"])
    other = _metrics(tmp_path / "c.json", 0, ["2024-03-04", "2024-03-07"], [0.0, 0.0])
    with pytest.raises(ValueError, match="different test days"):
        read_test_records([*paths, other])


@pytest.fixture(scope="module")
def two_folds(inputs: dict) -> dict:
    """The same rows, split into two walk-forward folds of two test days each."""
    days = inputs["frame"]["trading_day"].unique().sort().to_list()
    path = inputs["root"] / "two_folds.json"
    make_fold_plan(days, TWO_FOLDS).save(path)
    return {**inputs, "folds": str(path)}


def _train_and_evaluate(inputs: dict, out, fold: int, min_t: float, record_min_t, record_paths=()) -> dict:
    config = json.loads(json.dumps(inputs["config"]))
    config["training"].update(gate_min_t=min_t, record_min_t=record_min_t)
    hparams = out / "hparams.json"
    hparams.write_text(json.dumps({"algo": "linear", "best_params": HPARAMS["linear"]}), encoding="utf-8")
    paths = {"manifest_path": inputs["manifest"], "folds_path": inputs["folds"]}
    train_job(
        model="linear",
        fold=fold,
        seed_indices=[0],
        hparams_path=str(hparams),
        config=config,
        model_paths=[str(out / f"model_{fold}.pt")],
        log_paths=[str(out / f"train_log_{fold}.json")],
        resume_path=str(out / f"resume_{fold}.pt"),
        **paths,
    )
    (metrics,) = evaluate_job(
        model="linear",
        fold=fold,
        seed_indices=[0],
        model_paths=[str(out / f"model_{fold}.pt")],
        config=config,
        metrics_paths=[str(out / f"metrics_{fold}.json")],
        bars_paths=[str(out / f"bars_{fold}.parquet")],
        record_paths=list(record_paths),
        **paths,
    )
    return {"metrics": metrics, "bars": pl.read_parquet(out / f"bars_{fold}.parquet")}


@pytest.mark.parametrize("record_min_t", [-1e9, 1e9])
def test_from_the_second_fold_the_record_decides_for_every_seed(two_folds: dict, record_min_t: float) -> None:
    out = two_folds["root"] / f"record_{record_min_t:g}"
    out.mkdir()
    # fold 0: the validation gate at a threshold no run reaches; its metrics still record what it would have made
    first = _train_and_evaluate(two_folds, out, 0, min_t=1e9, record_min_t=record_min_t)
    assert first["metrics"]["flat_gate"]["basis"] == VALIDATION and first["metrics"]["flat_gate"]["set_flat"]
    assert not first["bars"]["position"].abs().sum()
    ungated = first["metrics"]["ungated"]
    assert len(ungated["days"]) == 2 and ungated["avg_daily_turnover"] > 0  # it would have traded
    # fold 1: the same impossible validation threshold, but the record of fold 0 decides
    second = _train_and_evaluate(
        two_folds, out, 1, min_t=1e9, record_min_t=record_min_t, record_paths=[out / "metrics_0.json"]
    )
    gate = second["metrics"]["flat_gate"]
    assert gate["basis"] == RECORD and gate["n_days"] == 2
    assert gate["t_stat"] == pytest.approx(record_gate(read_test_records([out / "metrics_0.json"]), 0).t_stat)
    trades = bool(second["bars"]["position"].abs().sum())
    assert gate["set_flat"] is (record_min_t > 0) and trades is (record_min_t < 0)
    train_log = json.loads((out / "train_log_1.json").read_text())
    assert train_log["flat_gate"]["basis"] == VALIDATION and train_log["flat_gate"]["set_flat"]
