"""The evaluate job: scored with the env settings and costs the model was trained with; a config that disagrees
on one of them fails with one line naming the key; metrics.json records the trained network's hidden sizes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from marketrl.agents import load_policy
from marketrl.env import EnvConfig, MarketData, evaluate
from marketrl.evaluation.evaluate import TrainedSettingsError, evaluate_job, trained_settings
from marketrl.instruments.costs import CostModel
from marketrl.splits.datasets import load_features
from marketrl.splits.folds import FoldPlan, select_rows
from marketrl.splits.normalize import FeatureNormalizer
from marketrl.training.train import train_job
from tests.support.runs import synthetic_job_inputs

# Trained with settings that all differ from the env defaults, so using the defaults anywhere would show.
TRAINED_ENV = {"window": 2, "contracts": 2, "episode_length": 16, "fill": "next_open", "max_gap": "6h"}
HPARAMS = {
    "learning_rate": 1e-3,
    "batch_size": 16,
    "learning_starts": 32,
    "target_update": 20,
    "hidden_dim_base": 8,
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny feature table, its fold plan, and a DQN trained on fold 0 through the train job."""
    root = tmp_path_factory.mktemp("evaluation")
    _, manifest, folds, config = synthetic_job_inputs(root, n_instruments=1)
    config["env"] = dict(TRAINED_ENV)
    # these tests check how evaluation scores a policy that trades (the gate's own tests: tests/test_gate.py)
    config["training"].update(total_steps=256, n_envs=4, checkpoint_every=10_000, gate_min_t=None)
    hparams = root / "dqn.json"
    hparams.write_text(json.dumps({"algo": "dqn", "best_params": HPARAMS}), encoding="utf-8")
    model = root / "model.pt"
    paths = {"manifest_path": str(manifest), "folds_path": str(folds)}
    train_job(
        model="dqn",
        fold=0,
        seed_indices=[0],
        hparams_path=str(hparams),
        config=config,
        model_paths=[str(model)],
        log_paths=[str(root / "train_log.json")],
        resume_path=str(root / "resume.pt"),
        **paths,
    )[0]
    return {"root": root, "config": config, "model": model, "paths": paths}


def run_evaluate(trained: dict, config: dict, name: str) -> tuple[dict, Path]:
    out = trained["root"] / name
    (result,) = evaluate_job(
        model="dqn",
        fold=0,
        seed_indices=[0],
        model_paths=[str(trained["model"])],
        config=config,
        metrics_paths=[str(out / "metrics.json")],
        bars_paths=[str(out / "bars.parquet")],
        **trained["paths"],
    )
    return result, out


def test_metrics_record_the_trained_hidden_sizes(trained: dict) -> None:
    _, out = run_evaluate(trained, trained["config"], "eval")
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    checkpoint = torch.load(trained["model"], weights_only=True)
    assert metrics["model"]["hidden"] == checkpoint["architecture"]["hidden"] == {"q": [8, 4, 2]}


def trading_copy(model: Path, seed: int = 0) -> Path:
    """The checkpoint with seeded random weights: a policy that trades, so fills, contracts and costs show."""
    checkpoint = torch.load(model, weights_only=True)
    generator = torch.Generator().manual_seed(seed)
    weights = checkpoint["state_dicts"]["q"]
    for name, value in weights.items():
        weights[name] = torch.randn(value.shape, generator=generator)
    path = model.with_name(f"trading_{seed}.pt")
    torch.save(checkpoint, path)
    return path


def test_evaluation_runs_with_the_checkpoint_settings(trained: dict) -> None:
    """The bars equal a direct evaluate() under the trained settings (window 2, next_open, 2 contracts)."""
    config = copy.deepcopy(trained["config"])
    config["env"]["episode_length"] = 64  # training-only settings may differ
    config["training"]["n_envs"] = 8
    model = trading_copy(trained["model"])
    result, out = run_evaluate({**trained, "model": model}, config, "eval_settings")
    bars = pl.read_parquet(out / "bars.parquet")

    policy, meta = load_policy(model)
    normalizer = FeatureNormalizer.from_state_dict(meta["normalizer"])
    plan = FoldPlan.load(trained["paths"]["folds_path"])
    test_rows = select_rows(load_features(trained["paths"]["manifest_path"]), plan.fold(0), "test")
    costs = CostModel.from_config(meta["extra"]["costs"])
    data = MarketData.from_frame(test_rows, normalizer.feature_names, normalizer, costs)
    expected = evaluate(policy, data, EnvConfig(window=2, contracts=2, fill="next_open"))
    assert bars.height == expected.height == result["metrics"]["n_bars"]
    np.testing.assert_array_equal(bars["position"].to_numpy(), expected["position"].to_numpy())
    np.testing.assert_array_equal(bars["net_return"].to_numpy(), expected["net_return"].to_numpy())
    assert set(bars["position"].unique()) <= {-2, 0, 2} and bars["position"].n_unique() > 1
    assert bars["cost"].sum() > 0


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        (
            "env",
            "window",
            1,
            "config key 'env.window': the model at {model} was trained with window=2, the config says 1",
        ),
        (
            "env",
            "fill",
            "close",
            "config key 'env.fill': the model at {model} was trained with "
            "fill=next_open, the config says close",
        ),
        (
            "env",
            "contracts",
            1,
            "config key 'env.contracts': the model at {model} was trained with "
            "contracts=2, the config says 1",
        ),
        (
            "env",
            "max_gap",
            None,
            "config key 'env.max_gap': the model at {model} was trained with "
            "max_gap=6h, the config says null",
        ),
        (
            "costs",
            "commission_per_contract",
            2.0,
            "config key 'costs.commission_per_contract': the model at "
            "{model} was trained with commission_per_contract=1.0, the config says 2.0",
        ),
        (
            "costs",
            "model",
            "bps",
            "config key 'costs.model': the model at {model} was trained with "
            "model=futures, the config says bps",
        ),
    ],
)
def test_a_config_that_disagrees_with_the_model_fails_naming_the_key(
    trained: dict, section: str, key: str, value: object, message: str
) -> None:
    config = copy.deepcopy(trained["config"])
    config[section][key] = value
    with pytest.raises(TrainedSettingsError) as error:
        run_evaluate(trained, config, f"eval_bad_{key}")
    assert str(error.value) == message.format(model=trained["model"])
    assert not (trained["root"] / f"eval_bad_{key}").exists()  # nothing written


def test_a_checkpoint_without_recorded_costs_is_refused(trained: dict) -> None:
    _, meta = load_policy(trained["model"])
    meta["extra"].pop("costs")
    with pytest.raises(TrainedSettingsError, match="records no costs; retrain"):
        trained_settings(meta, trained["config"], trained["model"])


def test_metrics_carry_turnover_matched_random_traders(trained: dict) -> None:
    """metrics.json's matched_random block: one trader per random-baseline seed, trading at the agent's rate of
    position changes, scored on the agent's test days."""
    model = trading_copy(trained["model"])
    _, out = run_evaluate({**trained, "model": model}, trained["config"], "eval_matched")
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    block = metrics["matched_random"]
    n_traders = trained["config"]["evaluation"]["random_baseline_seeds"]
    assert len(block["per_seed"]) == len(block["daily_net_returns"]) == n_traders
    bars = pl.read_parquet(out / "bars.parquet")
    # every position change pays a cost; the env starts each segment flat, so count changes by their costs
    agent_trades = int((bars["cost"] > 0).sum())
    assert agent_trades > 0
    decisions = bars.height  # one row per decision bar
    assert block["change_rate"] == pytest.approx(agent_trades / decisions)
    trader_trades = np.mean([summary["n_trades"] for summary in block["per_seed"]])
    # binomial sampling over all traders' decisions: within 4 standard errors of the agent's count
    rate = block["change_rate"]
    assert abs(trader_trades - agent_trades) < 4 * np.sqrt(decisions * rate * (1 - rate) / n_traders) + 1
    assert block["days"] == sorted({str(day) for day in bars["trading_day"].to_list()})
    for summary, daily in zip(block["per_seed"], block["daily_net_returns"], strict=True):
        assert len(daily) == len(block["days"]) == summary["n_days"]
        assert np.prod(1.0 + np.array(daily)) - 1.0 == pytest.approx(summary["total_return"])
    assert len({tuple(daily) for daily in block["daily_net_returns"]}) == n_traders  # independent seeds


def seed_job(trained: dict, name: str, seeds: list[int]) -> dict:
    """evaluate_job arguments for `seeds` of one model x fold (seed s: `trading_copy` with weights seed s)."""
    out = trained["root"] / name
    return {
        "model": "dqn",
        "fold": 0,
        "seed_indices": seeds,
        "model_paths": [str(trading_copy(trained["model"], seed)) for seed in seeds],
        "config": trained["config"],
        "metrics_paths": [str(out / f"seed_{seed}" / "metrics.json") for seed in seeds],
        "bars_paths": [str(out / f"seed_{seed}" / "bars.parquet") for seed in seeds],
        **trained["paths"],
    }


def test_one_job_scores_every_seed_as_separate_jobs_would(trained: dict) -> None:
    """One job for seeds 0..2 writes each seed's metrics and bars, equal to a job for that seed alone."""
    job = seed_job(trained, "eval_seeds", [0, 1, 2])
    results = evaluate_job(**job)
    assert [r["seed_index"] for r in results] == [0, 1, 2]
    sharpes = set()
    for seed, metrics_path, bars_path in zip(
        job["seed_indices"], job["metrics_paths"], job["bars_paths"], strict=True
    ):
        alone = seed_job(trained, f"eval_seed_{seed}_alone", [seed])
        evaluate_job(**alone)
        metrics = json.loads(Path(metrics_path).read_text(encoding="utf-8"))
        expected = json.loads(Path(alone["metrics_paths"][0]).read_text(encoding="utf-8"))
        assert metrics["seed_index"] == seed and metrics["model"]["path"] == job["model_paths"][seed]
        for key in ("metrics", "matched_random", "test_first", "test_last", "seed"):
            assert metrics[key] == expected[key], key
        assert pl.read_parquet(bars_path).equals(pl.read_parquet(alone["bars_paths"][0]))
        sharpes.add(metrics["metrics"]["sharpe"])
    assert len(sharpes) == 3  # three different policies, each scored as its own


def test_a_failed_job_leaves_no_output_of_any_seed(trained: dict) -> None:
    job = seed_job(trained, "eval_failed", [0, 1, 2])
    blocker = Path(job["metrics_paths"][1])  # a directory where seed 1's metrics go: its rename fails
    (blocker / "occupied").mkdir(parents=True)
    with pytest.raises(OSError):
        evaluate_job(**job)
    outputs = [Path(p) for p in (*job["metrics_paths"], *job["bars_paths"]) if Path(p) != blocker]
    assert not any(path.exists() for path in outputs)
    assert not [p for p in (trained["root"] / "eval_failed").rglob("*") if p.is_file()]  # no temp files left
