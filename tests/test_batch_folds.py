"""Folds on the batch axis (training.batch_folds): one job trains every fold x seed of a model, each fold on its
own rows, normalization, validation and gate, and every (fold, seed) ends where its own one-fold job ends."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from gpu_utils import HardwareBudget, detect_precision
from marketrl.agents.memory import folds_per_batch
from marketrl.env import EnvConfig, EnvDataError, MarketData, TradingEnv, stack_market_data
from marketrl.models.supervised_trainer import SMALL_HPARAMS
from marketrl.splits.datasets import fold_window, load_features
from marketrl.splits.folds import FoldPlan
from marketrl.training.train import fold_batches, train_folds_job, train_job
from marketrl.training.zoo import ZOO, FoldBlocks, TrainRequest, get_entry, run_settings
from tests.faults.pipeline import copy_of_shared_run, run_snakemake
from tests.support.runs import TINY_DQN_HPARAMS, TWO_FOLDS, synthetic_job_inputs

HPARAMS = {
    "dqn": TINY_DQN_HPARAMS,
    "ppo": {"n_steps": 8, "batch_size": 32, "n_epochs": 2, "hidden_dim_base": 8},
    "mlp": {"window": 3, "hidden_dim_base": 8, "batch_size": 32},
    # the other seed axis on the CPU (seeds one after another), and a batch wider than fold 0's last one
    "lstm": {"window": 3, "hidden_dim_base": 8, "batch_size": 48},
    "lightgbm": {"window": 3},
}
#: every torch forecaster of the zoo (the trainer that takes folds on the batch axis), at its small test sizes
TORCH_FORECASTERS = [
    name for name, entry in ZOO.items() if entry.kind == "forecaster" and entry.batches_folds
]
for _name in TORCH_FORECASTERS:
    HPARAMS.setdefault(_name, dict(SMALL_HPARAMS, window=3))
SEEDS = [0, 1]
FOLDS = [0, 1]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two expanding folds of a tiny random feature table, tiny budgets."""
    root = tmp_path_factory.mktemp("batch_folds")
    _, manifest, folds, config = synthetic_job_inputs(root, n_instruments=2, folds_config=TWO_FOLDS)
    config["env"].update(window=2, episode_length=8)
    config["training"].update(
        total_steps=256, n_envs=4, checkpoint_every=10_000, max_updates=20, check_every=5
    )
    return {"root": root, "config": config, "manifest_path": str(manifest), "folds_path": str(folds)}


def _windows(inputs: dict) -> list:
    table = load_features(inputs["manifest_path"])
    plan = FoldPlan.load(inputs["folds_path"])
    return [fold_window(table, plan, fold, inputs["config"], "cpu") for fold in FOLDS]


def test_stacked_data_keeps_each_part_whole(inputs: dict) -> None:
    """Every row of a part is the same row of the stack, shifted; no segment, chain or window crosses parts."""
    parts = [window.splits["train"] for window in _windows(inputs)]
    stacked, ranges = stack_market_data(parts)
    assert ranges == [(0, parts[0].n_rows), (parts[0].n_rows, parts[0].n_rows + parts[1].n_rows)]
    for part, (start, stop) in zip(parts, ranges, strict=True):
        torch.testing.assert_close(stacked.obs_table[start:stop], part.obs_table, rtol=0, atol=0)
        torch.testing.assert_close(
            stacked.segment_start[start:stop], part.segment_start + start, rtol=0, atol=0
        )
        torch.testing.assert_close(stacked.chain_start[start:stop], part.chain_start + start, rtol=0, atol=0)
        assert not bool(stacked.is_decision[stop - 1])  # a part's last row ends its chain
        for fill in ("close", "next_open"):
            torch.testing.assert_close(
                stacked.step_parameters(fill)[:, start:stop], part.step_parameters(fill), rtol=0, atol=0
            )
        rows = torch.arange(part.n_rows)
        position = torch.zeros(part.n_rows)
        torch.testing.assert_close(
            stacked.observe(rows + start, position, 3), part.observe(rows, position, 3), rtol=0, atol=0
        )
        starts = stacked.episode_starts(8)
        mine = starts[(starts >= start) & (starts < stop)] - start
        np.testing.assert_array_equal(mine, part.episode_starts(8))
    assert stack_market_data(parts[:1])[0] is parts[0]
    other = MarketData(**{**parts[1].__dict__, "feature_names": ["x"] * parts[1].n_features, "_cache": {}})
    with pytest.raises(EnvDataError, match="part 1 has feature_names"):
        stack_market_data([parts[0], other])


def test_env_blocks_on_their_own_rows_step_as_their_own_env(inputs: dict) -> None:
    """Block i of an env over the stack draws the starts, observations and rewards a single env over its part
    alone draws with the same seed (rows shifted)."""
    parts = [window.splits["train"] for window in _windows(inputs)]
    stacked, ranges = stack_market_data(parts)
    config = EnvConfig(n_envs=3, window=2, episode_length=8)
    together = TradingEnv(stacked, config, seed=[5, 6], block_rows=ranges)
    alone = [TradingEnv(part, config, seed=seed) for part, seed in zip(parts, [5, 6], strict=True)]
    obs = together.reset()
    for env in alone:
        env.reset()
    generator = torch.Generator().manual_seed(0)
    for _ in range(40):  # several episodes: the auto-resets draw from each block's own rows
        torch.testing.assert_close(obs, torch.cat([env_obs for env_obs in _observe(alone)]), rtol=0, atol=0)
        expected_rows = torch.cat([env.row + start for env, (start, _) in zip(alone, ranges, strict=True)])
        torch.testing.assert_close(together.row, expected_rows, rtol=0, atol=0)
        actions = torch.randint(0, 3, (6,), generator=generator)
        obs, reward, _, _ = together.step(actions)
        rewards = [env.step(actions[3 * i : 3 * i + 3])[1] for i, env in enumerate(alone)]
        torch.testing.assert_close(reward, torch.cat(rewards), rtol=0, atol=0)
    with pytest.raises(Exception, match="block_rows"):
        TradingEnv(stacked, config, seed=[5, 6], block_rows=ranges[:1])


def _observe(envs: list[TradingEnv]) -> list[torch.Tensor]:
    return [env.data.observe(env.row, env.position, env.window) for env in envs]


def _hparams(root: Path, model: str, name: str) -> str:
    path = root / f"{model}_{name}_hparams.json"
    path.write_text(json.dumps({"algo": model, "best_params": HPARAMS[model]}), encoding="utf-8")
    return str(path)


def _run(inputs: dict, model: str, batched: bool) -> tuple[list[dict], dict[tuple[int, int], dict]]:
    """Train ``model`` on both folds x SEEDS, in one fold-batched job or one job per fold; (train logs, each
    (fold, seed index)'s saved state)."""
    root = inputs["root"] / f"{model}_{'batched' if batched else 'per_fold'}"
    root.mkdir()
    hparams = _hparams(root, model, "best")
    common = {"manifest_path": inputs["manifest_path"], "folds_path": inputs["folds_path"]}
    units = [(fold, index) for fold in FOLDS for index in SEEDS]
    models = [str(root / f"f{fold}s{index}.pt") for fold, index in units]
    logs = [str(root / f"f{fold}s{index}.json") for fold, index in units]
    if batched:
        records = train_folds_job(
            model=model,
            folds=FOLDS,
            seed_indices=SEEDS,
            hparams_paths=[hparams] * len(FOLDS),
            config=inputs["config"],
            model_paths=models,
            log_paths=logs,
            resume_paths=[str(root / f"resume_{fold}.pt") for fold in FOLDS],
            **common,
        )
    else:
        records = []
        for fold in FOLDS:
            mine = [position for position, unit in enumerate(units) if unit[0] == fold]
            records += train_job(
                model=model,
                fold=fold,
                seed_indices=SEEDS,
                hparams_path=hparams,
                config=inputs["config"],
                model_paths=[models[position] for position in mine],
                log_paths=[logs[position] for position in mine],
                resume_path=str(root / f"resume_{fold}.pt"),
                **common,
            )
    states = {unit: torch.load(path, weights_only=False) for unit, path in zip(units, models, strict=True)}
    return records, states


def _without_key_bias(in_proj_bias: torch.Tensor) -> torch.Tensor:
    """Multi-head attention's packed [query; key; value] bias without its key third."""
    width = in_proj_bias.shape[0] // 3
    return torch.cat([in_proj_bias[:width], in_proj_bias[2 * width :]])


def _tensors(state: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a saved checkpoint, by its path."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    if isinstance(state, dict):
        out: dict[str, torch.Tensor] = {}
        for key, value in state.items():
            out.update(_tensors(value, f"{prefix}/{key}"))
        return out
    return {}


@pytest.mark.parametrize("model", ["dqn", "ppo", *TORCH_FORECASTERS, "lightgbm"])
def test_fold_batched_job_ends_where_each_fold_job_ends(inputs: dict, model: str) -> None:
    """Agents and torch forecasters put both folds x both seeds on the batch axis (the forecasters' folds with
    their own row counts, batch sizes, step budgets, validations and early stops), lightgbm trains the folds one
    after another; either way every (fold, seed) has the seed, weights, validation scores, gate and statistics
    of its own one-fold job (to float tolerance: a batched product or a masked mean may sum in another order)."""
    batched_logs, batched = _run(inputs, model, batched=True)
    alone_logs, alone = _run(inputs, model, batched=False)
    tolerance = {"rtol": 1e-4, "atol": 1e-5}
    for together, single in zip(batched_logs, alone_logs, strict=True):
        assert (together["fold"], together["seed_index"], together["seed"]) == (
            single["fold"],
            single["seed_index"],
            single["seed"],
        )
        assert together.get("flat_gate") == single.get("flat_gate")
        assert [record["step"] for record in together["validation"]] == [
            record["step"] for record in single["validation"]
        ]
        np.testing.assert_allclose(
            [record["val_sharpe"] for record in together["validation"]],
            [record["val_sharpe"] for record in single["validation"]],
            **tolerance,
        )
        for key in ("steps", "total_steps", "steps_per_epoch", "batch_size", "train_rows", "stopped_at"):
            assert together.get(key) == single.get(key), key
        if (
            model in TORCH_FORECASTERS
        ):  # another fold's end splits a statistics window: a read more, never less
            steps = {record["step"] for record in together["history"]}
            assert {record["step"] for record in single["history"]} <= steps
        else:
            assert len(together["history"]) == len(single["history"])
        assert together["batch"].get("folds") == (None if model == "lightgbm" else FOLDS)
    for unit, state in batched.items():
        if model == "lightgbm":  # a booster, as text
            assert state["state"]["booster"] == alone[unit]["state"]["booster"], unit
            continue
        tensors, expected = _tensors(state), _tensors(alone[unit])
        assert tensors.keys() == expected.keys() and tensors
        for key, value in tensors.items():
            if key.endswith(
                "in_proj_bias"
            ):  # attention's key bias: softmax ignores it (a shift of every logit),
                value, expected[key] = (
                    _without_key_bias(value),
                    _without_key_bias(expected[key]),
                )  # its gradient
                # is rounding noise that Adam scales to whole steps, and it changes no output
            if value.is_floating_point():
                torch.testing.assert_close(value, expected[key], **tolerance, msg=f"{unit} {key}")
            else:
                assert torch.equal(value, expected[key]), f"{unit} {key}"
    # the folds really differ: fold 1's normalizer was fit on its own (longer) window
    assert not torch.equal(
        _tensors(batched[(0, 0)]).get("/normalizer/mean", torch.zeros(1)),
        _tensors(batched[(1, 0)]).get("/normalizer/mean", torch.ones(1)),
    )


def test_fold_batches_group_by_hyperparameters_and_memory() -> None:
    same = [{"a": 1}] * 4
    assert fold_batches([0, 1, 2, 3], same, lambda group: len(group)) == [[0, 1, 2, 3]]
    assert fold_batches([0, 1, 2, 3], same, lambda group: 3) == [[0, 1, 2], [3]]
    assert fold_batches([0, 1, 2], same[:3], lambda group: 1) == [[0], [1], [2]]
    tuned = [{"a": 1}, {"a": 2}, {"a": 1}]  # hyperopt.per_fold: fold 1 its own parameters
    assert fold_batches([0, 1, 2], tuned, lambda group: len(group)) == [[0, 2], [1]]


def test_folds_per_batch_follows_the_device_memory() -> None:
    def budget(free: int) -> HardwareBudget:
        return HardwareBudget("cuda", "test", free, free)

    hparams = {"batch_size": 256, "hidden_dim_base": 64, "buffer_size": 10_000}
    plenty = folds_per_batch(budget(80 * 2**30), "dqn", 101, hparams, 64, "bf16", 16, 12)
    assert plenty == 12
    scarce = folds_per_batch(budget(400 * 2**20), "dqn", 101, hparams, 64, "bf16", 16, 12)
    assert 1 <= scarce < 12
    # the first count that does not fit would exceed the budget; the count chosen fits
    assert folds_per_batch(budget(1), "dqn", 101, hparams, 64, "bf16", 16, 12) == 1


def test_a_forecasters_folds_per_batch_follows_the_device_memory(inputs: dict) -> None:
    """More memory, more folds (up to all), and never a count that would shrink a seed's batch: with little
    memory the copies train one fold at a time."""
    train = _windows(inputs)[1].splits["train"]
    spec = get_entry("mlp").spec
    hparams = {"window": 16, "hidden_dim_base": 64, "batch_size": 4096}

    def fits(free: int) -> int:
        return spec.folds_per_batch(
            HardwareBudget("cuda", "test", free, free), train, hparams, "fp32", 16, 12
        )

    counts = [fits(2**power) for power in range(20, 36)]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] == 12
    assert any(1 < count < 12 for count in counts)
    before = torch.random.get_rng_state()
    fits(2**30)
    assert torch.equal(torch.random.get_rng_state(), before)  # the probe module leaves the caller's RNG alone


def test_the_trainer_wants_one_row_range_and_split_per_seed(inputs: dict) -> None:
    window = _windows(inputs)[0]
    with pytest.raises(ValueError, match="one row range and one validation split per seed"):
        get_entry("mlp").spec.train_seeds(
            window.splits["train"], None, run_settings(inputs["config"], 4), HPARAMS["mlp"], "fp32", "cpu",
            [1, 2], block_rows=[(0, 10)], block_validation=[None],
        )  # fmt: skip


def test_lightgbm_refuses_folds_on_the_batch_axis(inputs: dict) -> None:
    window = _windows(inputs)[0]
    request = TrainRequest(
        train_data=window.splits["train"],
        validation_data=None,
        config=inputs["config"],
        hparams=HPARAMS["lightgbm"],
        precision=detect_precision(torch.device("cpu"), "auto"),
        device=torch.device("cpu"),
        seeds=(1,),
        budget=4,
        blocks=FoldBlocks(train_rows=((0, 10),), validation=(None,)),
    )
    with pytest.raises(ValueError, match="one fold per request"):
        get_entry("lightgbm").train(request)


@pytest.mark.slow
def test_tiny_pipeline_with_batch_folds_scores_every_run_as_before(shared_run: Path, tmp_path: Path) -> None:
    """The tiny run again with training.batch_folds on (both agents' folds in one job each, the same tuned
    hyperparameters): every (model, fold, seed)'s test metrics equal the per-fold jobs' to 1e-6 (on the CPU
    they are the same numbers)."""
    run = copy_of_shared_run(tmp_path / "run")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["training"]["batch_folds"] = True
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    result = run_snakemake(run, "--cores", "2", "results/eval_report.html")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    log = result.stdout + result.stderr
    assert "rule train_folds:" in log and "rule train:" not in log and "rule hyperopt_worker:" not in log
    compared = 0
    for before in sorted((shared_run / "results" / "eval").glob("*/fold_*/seed_*/metrics.json")):
        if before.parts[-4] == "baselines":
            continue
        after = run / before.relative_to(shared_run)
        old, new = json.loads(before.read_text())["metrics"], json.loads(after.read_text())["metrics"]
        numbers = [key for key, value in old.items() if isinstance(value, float)]
        assert numbers and old.keys() == new.keys()
        np.testing.assert_allclose([new[key] for key in numbers], [old[key] for key in numbers], rtol=1e-6)
        train_log = Path(str(after.parent).replace("/results/eval/", "/results/models/")) / "train_log.json"
        log_after = json.loads(train_log.read_text())
        assert log_after["batch"]["folds"] == [0, 1]
        compared += 1
    assert compared == len(config["training"]["models"]) * config["folds"]["n"] * config["training"]["seeds"]
