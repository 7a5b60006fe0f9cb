"""The supervised model zoo: every registered model learns a planted signal net of costs, never looks ahead,
round-trips its checkpoint through `torch.load(weights_only=True)`; the torch trainer reads the host only at its
check boundaries, is deterministic, stops early, prunes and resumes; rows, trading rule and ICs are exact.

Tiny data (a few hundred bars) and a few dozen optimizer steps per model keep the file fast.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from gpu_utils import SyncCounter
from marketrl.env import EnvConfig, MarketData, position_results, rule_positions
from marketrl.instruments.costs import CostModel
from marketrl.loop.hparams import HParamError
from marketrl.loop.resume import TrainingCheckpoint
from marketrl.models import (
    MODELS,
    ModelSpec,
    RunSettings,
    TrainedModel,
    TrainHooks,
    load_model,
    model_from_checkpoint,
    save_model,
)
from marketrl.models.supervised_data import (
    ModelDataError,
    SupervisedRows,
    forward_returns,
    full_window_rows,
    training_rows,
)
from marketrl.models.trading_rule import TradingRule
from marketrl.scoring.metrics import daily_information_coefficients, information_coefficient_summary
from marketrl.settings.registry import REGISTRY, spec_location
from tests.support.one_seed import train_forecaster

COSTS = CostModel(kind="bps", bps=1.0)
MARGIN = 0.003  # planted edge per bar; the round trip costs 2 bp
NEURAL = [name for name, spec in MODELS.items() if spec.neural]
#: Each model's small hyperparameters for the parametrized tests, from its own file (`ModelProfile.small`).
SMALL = {name: dict(spec.profile.small) for name, spec in MODELS.items() if spec.profile is not None}
SETTINGS = RunSettings(costs={"kind": "bps", "bps": 1.0}, epochs=2, check_every=10)


def planted_arrays(
    n_bars: int, seed: int, *, instruments: int = 1, sign: float = 1.0
) -> dict[str, np.ndarray]:
    """Bars whose next return is sign·MARGIN·sign(f0_t) plus small noise; f1, f2 are noise. Instruments follow
    each other (sorted), each with its own price path."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(n_bars * instruments, 3)).astype(np.float32)
    closes, ids, ts = [], [], []
    for k in range(instruments):
        f0 = features[k * n_bars : (k + 1) * n_bars, 0]
        returns = np.zeros(n_bars)
        returns[1:] = sign * MARGIN * np.sign(f0[:-1]) + rng.normal(0.0, 0.0005, n_bars - 1)
        closes.append(100.0 * np.cumprod(1.0 + returns))
        ids.append(np.full(n_bars, k + 1))
        ts.append(1_704_153_600 * 10**9 + np.arange(n_bars, dtype=np.int64) * 60 * 10**9)
    close = np.concatenate(closes)
    return {
        "features": features,
        "opens": close,
        "closes": close,
        "instrument_id": np.concatenate(ids),
        "ts_event_ns": np.concatenate(ts),
    }


def market(arrays: dict[str, np.ndarray]) -> MarketData:
    return MarketData.from_arrays(**arrays, cost_model=COSTS, max_gap=None)


def planted(n_bars: int, seed: int, **kwargs: object) -> MarketData:
    return market(planted_arrays(n_bars, seed, **kwargs))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def splits() -> tuple[MarketData, MarketData]:
    return planted(600, 0), planted(300, 1)


@pytest.fixture(scope="module")
def trained(splits) -> dict[str, object]:
    """Each model trained once on the planted training split (shared by the tests below)."""
    train, _ = splits
    return {
        name: train_forecaster(spec, train, None, SETTINGS, SMALL[name], "fp32", "cpu", 0)
        for name, spec in MODELS.items()
    }


# ------------------------------------------------------------------------------------------- per-model behaviour


def check_learns_planted_signal(model: TrainedModel, test: MarketData) -> None:
    """The model's positions earn the planted edge after costs on the test split (a random trader does not)."""
    results = position_results(test, model.positions(test))
    decision = test.is_decision
    net = float(results.net_return[decision].mean())
    random = position_results(test, rule_positions(test, "random", seed=3))
    assert net > 0.0015, f"{model.name} earned {net:.5f} per bar after costs (the edge is {MARGIN})"
    assert float(random.net_return[decision].mean()) < 0.0005
    assert float(results.cost.sum()) > 0  # it trades


def check_no_look_ahead(model: TrainedModel) -> None:
    """A row's prediction reads neither later bars nor the previous segment, and needs a full window."""
    arrays = planted_arrays(80, 5, instruments=2)
    base = model.predict(market(arrays))
    t = 80 + 40  # a row in the second instrument's segment
    perturbed = {**arrays, "features": arrays["features"].copy()}
    perturbed["features"][t + 1 :] += 3.0  # later bars of the same segment
    perturbed["features"][:80] *= -2.0  # the whole previous segment (another instrument)
    after = model.predict(market(perturbed))
    assert torch.equal(base[80 : t + 1], after[80 : t + 1])
    assert not torch.equal(base[t + 1 :], after[t + 1 :])  # the perturbation does reach the model
    window = model.window
    assert not base[80 : 80 + window - 1].any()  # rows without a full window get no prediction (flat)


def same_data(a: object, b: object) -> bool:
    """Plain data (dicts, lists, tensors, scalars) equal, dict keys in the same order."""
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same_data(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(same_data, a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def check_checkpoint_round_trip(
    model: TrainedModel, test: MarketData, path: Path, spec: ModelSpec | None = None
) -> None:
    """`save_model`, then `torch.load(weights_only=True)` rebuilds the same predictions and positions (``spec``:
    the model's own where it is not one of `MODELS`, e.g. registered by config)."""
    save_model(path, model, fold=0, seed=0)
    raw = torch.load(path, weights_only=True)
    assert raw["model"] == model.name and raw["extra"] == {"fold": 0, "seed": 0}
    assert raw["settings"]["costs"] == {"kind": "bps", "bps": 1.0}
    loaded = load_model(path) if spec is None else model_from_checkpoint(raw, spec=spec)
    assert torch.equal(loaded.predict(test), model.predict(test))
    assert torch.equal(model_from_checkpoint(raw, spec=spec).positions(test), model.positions(test))
    # the one save/load pair by path of every spec: a forecaster's writes the same checkpoint dict, with the
    # normalizer, feature names and env settings first in ``extra``, and reads back the model and its meta
    own = spec or MODELS[model.name]
    normalizer = {"mean": [0.0], "std": [1.0]}
    own.save(
        path.with_suffix(".spec.pt"),
        model,
        hparams={"ignored": "a forecaster records its own"},
        precision="ignored",
        normalizer=normalizer,
        feature_names=["f0"],
        env={"fill": "close"},
        extra={"fold": 0, "seed": 0},
    )
    save_model(
        path, model, normalizer=normalizer, feature_names=["f0"], env={"fill": "close"}, fold=0, seed=0
    )
    by_spec, direct = (torch.load(p, weights_only=True) for p in (path.with_suffix(".spec.pt"), path))
    assert list(by_spec) == list(direct) and list(by_spec["extra"]) == list(direct["extra"])
    assert same_data(by_spec, direct)
    again, meta = own.load_path(path.with_suffix(".spec.pt"))
    assert (
        meta["normalizer"] == normalizer and meta["env"] == {"fill": "close"} and meta["extra"]["fold"] == 0
    )
    assert torch.equal(again.run_positions(test, EnvConfig()), model.positions(test))


@pytest.mark.parametrize("name", list(MODELS))
def test_model_learns_planted_signal_net_of_costs(name: str, splits, trained) -> None:
    check_learns_planted_signal(trained[name], splits[1])


@pytest.mark.parametrize("name", list(MODELS))
def test_predictions_never_look_ahead_or_across_segments(name: str, trained) -> None:
    check_no_look_ahead(trained[name])


@pytest.mark.parametrize("name", list(MODELS))
def test_checkpoint_round_trip_weights_only(name: str, splits, trained, tmp_path) -> None:
    check_checkpoint_round_trip(trained[name], splits[1], tmp_path / f"{name}.pt")


def test_registry_and_search_spaces() -> None:
    # every model's file gives its small hyperparameters for the parametrized tests (`ModelProfile.small`)
    assert set(SMALL) == set(MODELS) and all(SMALL.values())

    class LowTrial:
        """Answers every suggestion with its lowest choice and records the names."""

        def __init__(self) -> None:
            self.names: list[str] = []
            self.highs: dict[str, int] = {}

        def suggest_int(self, name: str, low: int, high: int, **_: object) -> int:
            self.names.append(name)
            self.highs[name] = high
            return low

        def suggest_float(self, name: str, low: float, high: float, **_: object) -> float:
            self.names.append(name)
            return low

        def suggest_categorical(self, name: str, choices: list[object]) -> object:
            self.names.append(name)
            self.highs[name] = max(choices)  # type: ignore[type-var]
            return choices[0]

    for name, spec in MODELS.items():
        trial = LowTrial()
        hparams = spec.search_space(trial)
        assert set(hparams) == set(trial.names)
        assert {"window", "threshold_multiplier", "hold_band"} <= set(hparams), name
        assert ("hidden_dim_base" in hparams) == spec.neural, name
        resolved = spec.hparams_class(**hparams)
        resolved.validate()
        # the ranges that bound a trial's cost are pinned in tests/test_search_space_bounds.py


def test_model_files_do_not_import_optuna() -> None:
    package = Path(sys.modules["marketrl.models"].__file__).parent
    files = sorted(package.glob("*.py"))
    shared = {"__init__.py", "base.py", "supervised_data.py", "supervised_trainer.py", "trading_rule.py"}
    model_files = {spec_location(REGISTRY[name])[0].rpartition(".")[2] + ".py" for name in MODELS}
    assert {path.name for path in files} >= shared | model_files  # every file of the package is checked
    for path in files:
        source = path.read_text()
        assert "import optuna" not in source and "from optuna" not in source, path.name


def test_bad_inputs_fail_in_one_line(splits) -> None:
    train, _ = splits
    with pytest.raises(HParamError, match=r"hparams\.depth: unknown mlp hyperparameter"):
        train_forecaster(MODELS["mlp"], train, None, SETTINGS, {"depth": 3}, "fp32", "cpu", 0)
    with pytest.raises(HParamError, match=r"hparams\.n_heads: expected a divisor of hidden_dim_base"):
        train_forecaster(
            MODELS["transformer"],
            train,
            None,
            SETTINGS,
            {"hidden_dim_base": 10, "n_heads": 4},
            "fp32",
            "cpu",
            0,
        )
    with pytest.raises(ModelDataError, match="train_data: no row has a full window of 700 rows"):
        train_forecaster(MODELS["linear"], train, None, SETTINGS, {"window": 700}, "fp32", "cpu", 0)


# --------------------------------------------------------------------------------------------- the torch trainer


@pytest.mark.parametrize("name", NEURAL)
def test_torch_trainer_reads_the_host_only_at_check_boundaries(name: str, splits) -> None:
    train, _ = splits

    def syncs(steps: int) -> int:
        settings = dataclasses.replace(SETTINGS, epochs=100, max_steps=steps, check_every=10)
        with SyncCounter(count_cpu=True) as counter:
            model = train_forecaster(MODELS[name], train, None, settings, SMALL[name], "fp32", "cpu", 0)
        assert model.log["steps"] == steps
        return counter.count

    assert (syncs(20), syncs(40)) == (2, 4)  # one statistics read per 10 steps, nothing else


def test_validation_costs_one_read_and_early_stopping_restores_the_best(splits) -> None:
    train, _ = splits
    inverted = planted(200, 7, sign=-1.0)  # validation rewards the opposite of what training teaches
    settings = dataclasses.replace(SETTINGS, epochs=100, max_steps=60, eval_every=10, patience=2)
    with SyncCounter(count_cpu=True) as counter:
        model = train_forecaster(MODELS["mlp"], train, inverted, settings, SMALL["mlp"], "fp32", "cpu", 0)
    stopped = model.log["stopped_at"]
    assert stopped is not None and stopped < 60
    assert counter.count == 2 * stopped // 10  # per 10 steps: one statistics read and one validation read
    best = model.log["best_step"]
    assert stopped == best + 20
    rows = SupervisedRows.build(inverted, model.window, 1)
    windows, target = rows.batch(rows.rows)
    loss = float((model.predictor(windows) - target).double().square().mean())
    assert loss == pytest.approx(model.log["best_validation_loss"], rel=1e-6)


def test_validation_hook_sees_the_model_and_may_prune(splits) -> None:
    train, test = splits

    class Pruned(Exception):
        pass

    seen: list[int] = []
    progress: list[dict] = []

    def hook(step: int, model) -> float:
        seen.append(step)
        if step >= 20:
            raise Pruned
        return float(position_results(test, model.positions(test)).net_return.sum())

    settings = dataclasses.replace(SETTINGS, epochs=100, max_steps=60, eval_every=10)
    with pytest.raises(Pruned):
        hooks = TrainHooks(on_validation=hook, log=progress.append)
        train_forecaster(MODELS["gru"], train, None, settings, SMALL["gru"], "fp32", "cpu", 0, hooks)
    assert seen == [10, 20]
    assert [record["step"] for record in progress] == [10, 20]  # progress records arrive as they are read
    assert all(math.isfinite(record["loss"]) for record in progress)


def test_torch_training_is_deterministic_and_resumes_exactly(splits, tmp_path) -> None:
    train, test = splits
    hparams = {**SMALL["mlp"], "dropout": 0.2}
    settings = dataclasses.replace(SETTINGS, epochs=100, max_steps=60, eval_every=10)
    first = train_forecaster(MODELS["mlp"], train, None, settings, hparams, "fp32", "cpu", 3)
    second = train_forecaster(MODELS["mlp"], train, None, settings, hparams, "fp32", "cpu", 3)
    other = train_forecaster(MODELS["mlp"], train, None, settings, hparams, "fp32", "cpu", 4)
    weights = first.checkpoint()["state"]["state_dict"]
    assert all(
        torch.equal(weights[key], value) for key, value in second.checkpoint()["state"]["state_dict"].items()
    )
    assert not torch.equal(first.predict(test), other.predict(test))

    class Killed(Exception):
        pass

    def dies_at_50(step: int, _model) -> None:
        if step == 50:
            raise Killed

    path = tmp_path / "resume.pt"
    with pytest.raises(Killed):
        train_forecaster(
            MODELS["mlp"],
            train,
            None,
            settings,
            hparams,
            "fp32",
            "cpu",
            3,
            TrainHooks(on_validation=dies_at_50, checkpoint=TrainingCheckpoint(path, 20, {"run": 1})),
        )
    assert path.exists()  # saved at step 40
    resumed = train_forecaster(
        MODELS["mlp"],
        train,
        None,
        settings,
        hparams,
        "fp32",
        "cpu",
        3,
        TrainHooks(checkpoint=TrainingCheckpoint(path, 20, {"run": 1})),
    )
    assert torch.equal(resumed.predict(test), first.predict(test))
    assert [record["step"] for record in resumed.log["history"]] == [10, 20, 30, 40, 50, 60]


def test_linear_is_deterministic_and_exact(splits) -> None:
    train, _ = splits
    one = train_forecaster(
        MODELS["linear"], train, None, SETTINGS, {"window": 2, "alpha": 0.0}, "fp32", "cpu", 0
    )
    two = train_forecaster(
        MODELS["linear"], train, None, SETTINGS, {"window": 2, "alpha": 0.0}, "fp32", "cpu", 1
    )
    assert torch.equal(one.state["weights"], two.state["weights"])
    rows = SupervisedRows.build(train, 2, 1)
    windows, target = rows.batch(rows.rows)
    x = np.c_[windows.reshape(rows.n_rows, -1).double().numpy(), np.ones(rows.n_rows)]
    reference = np.linalg.lstsq(x, target.double().numpy(), rcond=None)[0]
    np.testing.assert_allclose(one.state["weights"].numpy(), reference[:-1], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_plans_train(precision: str, splits) -> None:
    from tests.test_agents import cpu_fp16_plan

    train, test = splits
    plan = cpu_fp16_plan() if precision == "fp16" else "bf16"  # fp16: autocast + GradScaler("cpu")
    settings = dataclasses.replace(SETTINGS, max_steps=20)
    model = train_forecaster(MODELS["tcn"], train, None, settings, SMALL["tcn"], plan, "cpu", 0)
    assert model.precision["mode"] == precision
    assert all(math.isfinite(record["loss"]) for record in model.log["history"])
    assert torch.isfinite(model.predict(test)).all()


def test_batch_size_is_capped_by_the_memory_budget(splits) -> None:
    from gpu_utils import HardwareBudget

    train, _ = splits
    tiny = HardwareBudget("cpu", "test", total_memory_bytes=2**20, free_memory_bytes=2**20)
    settings = dataclasses.replace(SETTINGS, max_steps=2)
    hparams = {**SMALL["lstm"], "batch_size": 512}
    roomy = train_forecaster(MODELS["lstm"], train, None, settings, hparams, "fp32", "cpu", 0)
    capped = train_forecaster(
        MODELS["lstm"], train, None, settings, hparams, "fp32", "cpu", 0, TrainHooks(budget=tiny)
    )
    assert roomy.log["batch_size"] == 512
    assert capped.log["batch_size"] == capped.log["batch_size_max"] < 512


# ------------------------------------------------------------------------------------------ rows and the rule


def test_rows_and_targets_stay_inside_segments() -> None:
    arrays = planted_arrays(30, 2, instruments=2)
    arrays["ts_event_ns"][40:] += 3 * 86_400 * 10**9  # a missing weekday splits the second instrument
    data = MarketData.from_arrays(**arrays, cost_model=COSTS)
    assert data.segment_first.tolist() == [0, 30, 40]
    rows = full_window_rows(data, window=3, horizon=2)
    expected = [*range(2, 28), *range(32, 38), *range(42, 58)]
    assert rows.tolist() == expected
    target = forward_returns(data, 2).double().numpy()
    close = arrays["closes"]
    np.testing.assert_allclose(target[rows], close[rows + 2] / close[rows] - 1.0, rtol=1e-6)
    windows, _ = SupervisedRows.build(data, 3, 2).batch(torch.as_tensor([42]))
    np.testing.assert_array_equal(windows[0].numpy(), arrays["features"][40:43])


def test_a_row_cap_fits_a_uniform_sample_in_time_order_the_same_for_every_seed() -> None:
    data = planted(800, 5)
    rows = SupervisedRows.build(data, 4, 1)
    sample = rows.sample(300)
    picked = sample.rows.numpy()
    assert sample.n_rows == picked.size == 300 and np.all(np.diff(picked) > 0)
    assert set(picked) <= set(rows.rows.numpy())
    assert picked[0] < rows.rows[rows.n_rows // 10] and picked[-1] > rows.rows[-rows.n_rows // 10]  # spans it
    assert torch.equal(rows.sample(300).rows, sample.rows)  # drawn from the row counts alone: no run seed
    assert rows.sample(rows.n_rows) is rows and training_rows(data, 4, 1).n_rows == rows.n_rows
    assert torch.equal(training_rows(data, 4, 1, max_rows=300).rows, sample.rows)
    capped = dataclasses.replace(SETTINGS, max_train_rows=300)
    for name in ("lightgbm", "mlp", "linear"):
        (model,) = MODELS[name].train_seeds(data, None, capped, SMALL[name], "fp32", "cpu", [0])
        assert model.log["train_rows"] == 300, name
    with pytest.raises(ValueError, match=r"^training.max_train_rows: expected an integer >= 1, got 0$"):
        RunSettings(max_train_rows=0)


def _reference_rule(pred, cost, first_rows, is_decision, multiplier, band):
    """A plain loop over rows: the rule as docs/MODELS.md states it."""
    positions = np.zeros(pred.size)
    held = 0.0
    for t in range(pred.size):
        if t in first_rows:
            held = 0.0
        threshold = multiplier * 2 * cost[t]
        if abs(pred[t]) > threshold:
            target = np.sign(pred[t])
        elif abs(pred[t]) > band * threshold and np.sign(pred[t]) == held:
            target = held
        else:
            target = 0.0
        if not is_decision[t]:
            target = 0.0
        positions[t] = held = target
    return positions


@pytest.mark.parametrize(("multiplier", "band"), [(1.0, 1.0), (1.5, 0.3), (0.0, 1.0)])
def test_trading_rule_matches_the_plain_loop(multiplier: float, band: float) -> None:
    data = planted(100, 4, instruments=3)
    predictions = torch.as_tensor(np.random.default_rng(0).normal(0, 4e-4, data.n_rows), dtype=torch.float32)
    positions = TradingRule(multiplier, band).positions(predictions, data).numpy()
    reference = _reference_rule(
        predictions.numpy(),
        data.cost_close.numpy(),
        set(data.segment_first.tolist()),
        data.is_decision.numpy(),
        multiplier,
        band,
    )
    np.testing.assert_array_equal(positions, reference)
    if band < 1:  # the band cuts turnover against the plain threshold
        plain = TradingRule(multiplier, 1.0).positions(predictions, data).numpy()
        assert np.abs(np.diff(positions)).sum() < np.abs(np.diff(plain)).sum()


def test_information_coefficients_by_day() -> None:
    rng = np.random.default_rng(0)
    days = np.repeat([3, 1, 2], 20)
    pred = rng.normal(size=60)
    real = 0.5 * pred + rng.normal(size=60)
    real[40:] = rng.normal(size=20)
    found_days, ic, rank_ic = daily_information_coefficients(days, pred, real)
    assert found_days.tolist() == [1, 2, 3]
    for k, day in enumerate(found_days):
        mask = days == day
        assert ic[k] == pytest.approx(stats.pearsonr(pred[mask], real[mask])[0])
        assert rank_ic[k] == pytest.approx(stats.spearmanr(pred[mask], real[mask])[0])
    summary = information_coefficient_summary(days, pred, real)
    assert summary["n_days"] == 3
    assert summary["ic"] == pytest.approx(ic.mean())
    assert summary["icir"] == pytest.approx(ic.mean() / ic.std(ddof=1))
    assert summary["rank_icir"] == pytest.approx(rank_ic.mean() / rank_ic.std(ddof=1))
    _, short, _ = daily_information_coefficients(np.array([1, 1, 2, 2, 2]), np.arange(5.0), np.arange(5.0))
    assert math.isnan(short[0]) and short[1] == pytest.approx(1.0)


def test_lightgbm_validates_stops_early_and_resumes(splits, tmp_path) -> None:
    train, test = splits
    settings = dataclasses.replace(SETTINGS, check_every=5, eval_every=5)
    full = train_forecaster(MODELS["lightgbm"], train, test, settings, SMALL["lightgbm"], "fp32", "cpu", 0)
    assert [step for step, _ in full.log["evals"]] == [5, 10, 15, 20, 25, 30]
    assert [record["step"] for record in full.log["history"]] == [5, 10, 15, 20, 25, 30]

    class Killed(Exception):
        pass

    def dies_at_20(step: int, _model) -> None:
        if step == 20:
            raise Killed

    path = tmp_path / "lightgbm-resume.pt"  # train_seeds keeps seed 0's state in its part, resume.seed0.pt
    with pytest.raises(Killed):
        hooks = TrainHooks(on_validation=dies_at_20, checkpoint=TrainingCheckpoint(path, 10, {"run": 1}))
        train_forecaster(
            MODELS["lightgbm"], train, test, settings, SMALL["lightgbm"], "fp32", "cpu", 0, hooks
        )
    hooks = TrainHooks(checkpoint=TrainingCheckpoint(path, 10, {"run": 1}))
    resumed = train_forecaster(
        MODELS["lightgbm"], train, test, settings, SMALL["lightgbm"], "fp32", "cpu", 0, hooks
    )
    # resumed from round 10: the part saved only round 20 (a fresh run saves rounds 10 and 20), then was removed
    assert hooks.checkpoint.total_saves == 1 and not list(tmp_path.glob("lightgbm-resume*"))
    assert torch.equal(resumed.predict(test), full.predict(test))

    inverted = planted(200, 7, sign=-1.0)
    early = train_forecaster(
        MODELS["lightgbm"],
        train,
        inverted,
        dataclasses.replace(settings, patience=2),
        SMALL["lightgbm"],
        "fp32",
        "cpu",
        0,
    )
    assert early.log["best_step"] == 5 and early.log["steps"] == 15
    kept = load_model_from(early, tmp_path)
    assert torch.equal(kept.predict(test), early.predict(test))  # the checkpoint keeps the best 5 rounds


def load_model_from(model, tmp_path):
    path = tmp_path / "model.pt"
    save_model(path, model)
    return load_model(path)


def test_evaluation_frame_uses_the_env_fills_and_costs() -> None:
    from marketrl.env import EnvConfig
    from tests.test_agents import planted_data

    train, normalizer = planted_data(400, seed=0)
    test, _ = planted_data(200, seed=1, normalizer=normalizer)
    model = train_forecaster(MODELS["linear"], train, None, SETTINGS, {"window": 1}, "fp32", "cpu", 0)
    bars = model.evaluate(test)
    results = position_results(test, model.positions(test))
    assert bars.height == int(test.is_decision.sum())
    assert bars["net_return"].sum() == pytest.approx(
        float(results.net_return[test.is_decision].sum()), rel=1e-6
    )
    assert bars["net_return"].mean() > 0
    with pytest.raises(ValueError, match=r"env\.fill: linear was trained for fill 'close'"):
        model.evaluate(test, EnvConfig(fill="next_open", max_gap=None))


def test_non_finite_loss_stops_training_naming_the_window(splits) -> None:
    from gpu_utils import NonFiniteError
    from marketrl.models import mlp
    from marketrl.models.supervised_trainer import torch_model_spec

    class Diverges(mlp.MLP):
        def forward(self, windows: torch.Tensor) -> torch.Tensor:
            return super().forward(windows) * float("nan")

    spec = torch_model_spec("diverges", mlp.MLPHParams, mlp.search_space, Diverges)
    train, _ = splits
    with pytest.raises(NonFiniteError, match=r"non-finite 'seed 0: loss' between steps 1 and 10"):
        train_forecaster(spec, train, None, SETTINGS, SMALL["mlp"], "fp32", "cpu", 0)


def test_threshold_follows_the_run_settings_costs(splits, trained) -> None:
    _, test = splits
    model = trained["linear"]
    assert model.positions(test).abs().sum() > 0
    dear = dataclasses.replace(model, settings={**model.settings, "costs": {"model": "bps", "bps": 100.0}})
    assert not dear.positions(test).any()  # a 2% round trip dwarfs the 0.3% edge: never enter
    futures = {"model": "futures", "commission_per_contract": 1.0, "half_spread_ticks": 0.5}
    futures |= {
        "tick_size": 0.25,
        "tick_value": 12.5,
    }  # 7.25 per side on 100 x 50 notional: 2.9 bp round trip
    expected = 2 * 7.25 / (test.close * 50.0)
    from marketrl.models.trading_rule import cost_model, round_trip_cost

    torch.testing.assert_close(round_trip_cost(test, cost_model(futures)), expected.float())
    # A per-instrument config has no single cost fraction: one line, not an AttributeError deep in the rule.
    per_root = {**futures, "instruments": {"ES": {"tick_size": 0.25, "tick_value": 12.5}}}
    with pytest.raises(
        ValueError, match=r"^costs: a per-instrument cost model .* leave the run settings' costs"
    ):
        round_trip_cost(test, cost_model(per_root))


@pytest.mark.parametrize("name", ["dlinear", "lstm", "gru", "alstm", "mlp", "tcn", "transformer"])
def test_zero_head_models_start_at_the_mean_and_learn_their_head_first(name: str) -> None:
    """A zero head: the untrained model predicts 0 (the normalized target's mean) for any window, so it trades
    nothing until the data move it; the first gradient reaches the head only (the layers below follow once it is
    nonzero)."""
    spec = MODELS[name]
    hp = spec.hparams_class(window=4, hidden_dim_base=8)
    torch.manual_seed(0)
    model = spec.build_module(hp, 5)
    windows, target = torch.randn(64, 4, 5), torch.randn(64)
    prediction = model(windows)
    assert torch.equal(prediction, torch.zeros(64))
    torch.nn.functional.mse_loss(prediction, target).backward()
    head = [module for module in model.modules() if isinstance(module, torch.nn.Linear)][-1]
    assert head.weight.grad is not None and bool(head.weight.grad.abs().sum() > 0)
    below = [p for p in model.parameters() if p is not head.weight and p is not head.bias]
    assert below and not any(bool(p.grad.any()) for p in below if p.grad is not None)
