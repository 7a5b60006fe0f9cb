"""The validation gate (marketrl.scoring.gate): a run trades on the test days only where its validation days show
an edge after costs. Unit checks of the decision, then the train and evaluate jobs carrying it end to end: the
checkpoint, train_log.json and metrics.json record it, a run set flat trades nothing on its test days, the gate
changes no weights, and it reads no test day."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
import torch

from marketrl.env import EnvConfig
from marketrl.evaluation.evaluate import evaluate_job
from marketrl.instruments.costs import CostModel
from marketrl.scoring.gate import GateDecision, flat_gates, gated_positions
from marketrl.splits.datasets import write_feature_manifest
from marketrl.splits.folds import FoldPlan
from marketrl.training.train import train_job
from tests.support.runs import synthetic_job_inputs
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
