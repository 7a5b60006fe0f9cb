"""Several seeds of one forecaster in one call (`ModelSpec.train_seeds`, issue 24): the torch models train S seeds
as one vmapped computation. Every seed learns, the seeds differ, the seed axis cannot leak (one seed's weights or
seed value never change another's bits), each seed stops early on its own, a killed batch resumes to the same
result, and the batch reads the host as often as one seed does. LightGBM trains its seeds in turn; ridge once.

Tiny data (a few hundred bars) and a few dozen optimizer steps keep the file within seconds.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from gpu_utils import SyncCounter
from marketrl.env import stack_market_data
from marketrl.loop.resume import TrainingCheckpoint
from marketrl.models import MODELS, TrainHooks
from marketrl.models import mlp as mlp_module
from marketrl.models.supervised_data import SupervisedRows
from marketrl.models.supervised_trainer import torch_model_spec
from tests.support.one_seed import train_forecaster
from tests.test_models import SETTINGS, SMALL, planted

SEEDS = [3, 4, 5]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def splits():
    return planted(600, 0), planted(300, 1)


def weights(model) -> dict[str, torch.Tensor]:
    return model.checkpoint()["state"]["state_dict"]


def same_weights(a, b) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[key], wb[key]) for key in wa)


def correlation(model, data) -> float:
    rows = SupervisedRows.build(data, model.window, 1)
    windows, target = rows.batch(rows.rows)
    prediction = model.predictor(windows)
    return float(np.corrcoef(prediction.numpy(), target.numpy())[0, 1])


class Flagged(mlp_module.MLP):
    """The MLP plus a ``sign`` buffer (stacked with the weights, so per seed under vmap) that multiplies the
    output in eval mode only: a seed with sign -1 learns the signal in training while its validation loss grows,
    so it alone stops early. ``offset`` shifts its initial weights (a perturbed init)."""

    def __init__(self, hp, n_features: int, sign: float, offset: float) -> None:
        super().__init__(hp, n_features)
        self.register_buffer("sign", torch.tensor(sign))
        # torch's default init for the head (the MLP's starts at zero): from there a sign-1 seed's validation
        # loss falls at every check within the budget, which the early-stopping tests below rely on
        self.net[-1].reset_parameters()
        with torch.no_grad():
            for p in self.parameters():
                p.add_(offset)

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        out = super().forward(windows)
        return out if self.training else out * self.sign


def flagged_spec(signs: list[float], offsets: list[float] | None = None):
    """An MLP spec whose i-th built module (seed i of the batch: built in seed order) has ``signs[i]`` and
    ``offsets[i]``."""
    offsets = offsets or [0.0] * len(signs)
    built: list[nn.Module] = []

    def build(hp, n_features: int) -> nn.Module:
        index = len(built) % len(signs)
        built.append(Flagged(hp, n_features, signs[index], offsets[index]))
        return built[-1]

    return torch_model_spec("flagged", mlp_module.MLPHParams, mlp_module.search_space, build)


# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "axis"), [("mlp", "vmap"), ("gru", "loop"), ("gru", "vmap")])
def test_every_seed_learns_the_planted_signal_and_the_seeds_differ(
    name: str, axis: str, splits, monkeypatch
) -> None:
    from marketrl.models import supervised_trainer

    train, test = splits
    monkeypatch.setattr(supervised_trainer, "vectorize_seeds", lambda _module, _device: axis == "vmap")
    models = MODELS[name].train_seeds(train, None, SETTINGS, SMALL[name], "fp32", "cpu", SEEDS)
    assert models[0].log["seed_axis"] == axis
    assert len(models) == 3
    for seed, model in zip(SEEDS, models, strict=True):
        assert correlation(model, test) > 0.5, f"{name} seed {seed} did not learn the planted signal"
        assert model.log["batch_seeds"] == 3
    assert not same_weights(models[0], models[1])
    assert not same_weights(models[1], models[2])
    assert not torch.equal(models[0].predict(test), models[2].predict(test))
    # each result is an ordinary single-module checkpoint
    reloaded = MODELS[name].load(models[1].checkpoint(), "cpu")
    assert torch.equal(reloaded.predict(test), models[1].predict(test))


@pytest.mark.parametrize("axis", ["vmap", "loop"])
def test_the_seed_axis_cannot_leak(axis: str, splits, monkeypatch) -> None:
    from marketrl.models import supervised_trainer

    monkeypatch.setattr(supervised_trainer, "vectorize_seeds", lambda _module, _device: axis == "vmap")
    train, test = splits
    hparams = {**SMALL["mlp"], "dropout": 0.2}
    settings = dataclasses.replace(SETTINGS, epochs=100, max_steps=40, eval_every=10, patience=3)

    def run(seeds, offsets=()):
        spec = flagged_spec([1.0, 1.0, 1.0], offsets)
        return spec.train_seeds(train, test, settings, hparams, "fp32", "cpu", seeds)

    base = run(SEEDS)
    perturbed_init = run(SEEDS, offsets=[0.0, 0.05, 0.0])
    other_seed = run([3, 99, 5])
    for other in (perturbed_init, other_seed):
        assert not same_weights(base[1], other[1])  # seed 1 did change
        for i in (0, 2):
            assert same_weights(base[i], other[i])
            assert torch.equal(base[i].predict(test), other[i].predict(test))
            assert base[i].log["history"] == other[i].log["history"]


def test_each_seed_stops_early_on_its_own_and_keeps_its_best_weights(splits) -> None:
    train, test = splits
    settings = dataclasses.replace(SETTINGS, epochs=100, max_steps=80, eval_every=10, patience=2)
    seen: dict[int, torch.Tensor] = {}

    def hook(step: int, snapshots) -> None:
        seen[step] = weights(snapshots[1])["module.net.1.weight"].clone()

    models = flagged_spec([1.0, -1.0, 1.0]).train_seeds(
        train, test, settings, SMALL["mlp"], "fp32", "cpu", SEEDS, TrainHooks(on_validation=hook)
    )
    stopper, others = models[1], (models[0], models[2])
    stopped, best = stopper.log["stopped_at"], stopper.log["best_step"]
    assert stopped is not None and stopped == best + 20 and stopped < 80
    assert stopper.log["steps"] == stopped
    assert [step for step, _ in stopper.log["evals"]][-1] == stopped  # no validations after its stop
    for model in others:
        assert model.log["stopped_at"] is None and model.log["steps"] == 80
    # after its stop it does not move while the others train on (the optimizer's active mask)
    assert sorted(seen) == list(range(10, 90, 10))
    assert all(torch.equal(seen[step], seen[stopped]) for step in seen if step > stopped)
    assert not torch.equal(seen[stopped - 10], seen[stopped])
    # its kept weights are its weights at its best step: the same batch cut there gives them bit for bit
    cut = dataclasses.replace(settings, max_steps=best)
    at_best = flagged_spec([1.0, -1.0, 1.0]).train_seeds(train, test, cut, SMALL["mlp"], "fp32", "cpu", SEEDS)
    assert same_weights(at_best[1], stopper)
    assert not same_weights(at_best[0], models[0])  # the others went on


def test_a_killed_batch_resumes_to_the_uninterrupted_result(splits, tmp_path) -> None:
    train, test = splits
    hparams = {**SMALL["mlp"], "dropout": 0.2}
    settings = dataclasses.replace(SETTINGS, epochs=100, max_steps=80, eval_every=10, patience=2)
    signs = [1.0, -1.0, 1.0]  # seed 1 stops early: the resume carries the active mask and the best weights
    full = flagged_spec(signs).train_seeds(train, test, settings, hparams, "fp32", "cpu", SEEDS)
    assert full[1].log["stopped_at"] is not None

    class Killed(Exception):
        pass

    def dies_at_70(step: int, models) -> list[None]:
        assert len(models) == 3
        if step == 70:
            raise Killed
        return [None, None, None]

    path = tmp_path / "resume.pt"
    with pytest.raises(Killed):
        hooks = TrainHooks(on_validation=dies_at_70, checkpoint=TrainingCheckpoint(path, 20, {"run": 1}))
        flagged_spec(signs).train_seeds(train, test, settings, hparams, "fp32", "cpu", SEEDS, hooks)
    assert path.exists()  # one file for the batch, saved at step 60
    checkpoint = TrainingCheckpoint(path, 20, {"run": 1})
    resumed = flagged_spec(signs).train_seeds(
        train, test, settings, hparams, "fp32", "cpu", SEEDS, TrainHooks(checkpoint=checkpoint)
    )
    assert checkpoint.resumed_from == 60
    for a, b in zip(full, resumed, strict=True):
        assert same_weights(a, b)
        assert torch.equal(a.predict(test), b.predict(test))
        for key in ("stopped_at", "best_step", "best_validation_loss", "history"):
            assert a.log[key] == b.log[key]


def test_a_killed_fold_batch_resumes_to_the_uninterrupted_result(splits, tmp_path) -> None:
    """Folds on the batch axis (block_rows): two folds of different lengths, their own validation splits and
    budgets, one seed stopping early; killed after a save, the batch resumes to the same weights and logs, and
    every seed equals its fold trained alone (the trainer's own per-fold equality, on the CPU to 1e-6)."""
    train, test = splits
    other_train, other_test = planted(450, 2), planted(200, 3)
    stacked, ranges = stack_market_data([train, other_train])
    hparams = {**SMALL["mlp"], "dropout": 0.0}
    settings = dataclasses.replace(SETTINGS, epochs=3, max_steps=200, eval_every=10, patience=2)
    signs = [1.0, -1.0, 1.0, 1.0]
    seeds = [3, 4, 5, 6]
    blocks = {
        "block_rows": [ranges[0]] * 2 + [ranges[1]] * 2,
        "block_validation": [test] * 2 + [other_test] * 2,
    }
    full = flagged_spec(signs).train_seeds(stacked, None, settings, hparams, "fp32", "cpu", seeds, **blocks)
    assert full[0].log["total_steps"] != full[2].log["total_steps"]  # the folds' own budgets
    assert full[1].log["stopped_at"] is not None  # and one seed's early stop
    alone = flagged_spec(signs[:2]).train_seeds(train, test, settings, hparams, "fp32", "cpu", seeds[:2])
    alone += flagged_spec(signs[2:]).train_seeds(
        other_train, other_test, settings, hparams, "fp32", "cpu", seeds[2:]
    )
    for together, single in zip(full, alone, strict=True):
        for key in ("steps", "total_steps", "stopped_at", "best_step", "evals"):
            assert together.log[key] == single.log[key], key
        for key, value in weights(together).items():
            torch.testing.assert_close(value, weights(single)[key], rtol=1e-6, atol=1e-7)

    class Killed(Exception):
        pass

    def dies_at_40(step: int, models) -> list[None]:
        if step == 40:
            raise Killed
        return [None] * len(models)

    path = tmp_path / "resume.pt"
    with pytest.raises(Killed):
        hooks = TrainHooks(on_validation=dies_at_40, checkpoint=TrainingCheckpoint(path, 15, {"run": 1}))
        flagged_spec(signs).train_seeds(
            stacked, None, settings, hparams, "fp32", "cpu", seeds, hooks, **blocks
        )
    checkpoint = TrainingCheckpoint(path, 15, {"run": 1})
    resumed = flagged_spec(signs).train_seeds(
        stacked, None, settings, hparams, "fp32", "cpu", seeds, TrainHooks(checkpoint=checkpoint), **blocks
    )
    assert checkpoint.resumed_from == 30
    for a, b in zip(full, resumed, strict=True):
        assert same_weights(a, b)
        for key in ("stopped_at", "best_step", "best_validation_loss", "history"):
            assert a.log[key] == b.log[key]


def test_a_batch_reads_the_host_as_often_as_one_seed(splits) -> None:
    train, test = splits
    settings = dataclasses.replace(SETTINGS, epochs=100, max_steps=40, eval_every=10)

    def syncs(seeds: list[int]) -> int:
        with SyncCounter(count_cpu=True) as counter:
            MODELS["mlp"].train_seeds(train, test, settings, SMALL["mlp"], "fp32", "cpu", seeds)
        return counter.count

    assert syncs([3]) == syncs(SEEDS) == 8  # per 10 steps: one statistics read and one validation read


def test_a_non_finite_seed_is_named(splits) -> None:
    from gpu_utils import NonFiniteError

    train, _ = splits
    spec = flagged_spec([1.0, 1.0, 1.0], offsets=[0.0, float("nan"), 0.0])  # seed 4's weights are NaN
    settings = dataclasses.replace(SETTINGS, max_steps=10)
    with pytest.raises(NonFiniteError, match=r"^non-finite 'seed 4: loss' between steps 1 and 10"):
        spec.train_seeds(train, None, settings, SMALL["mlp"], "fp32", "cpu", SEEDS)


def test_lightgbm_trains_its_seeds_in_turn_and_ridge_once(splits, tmp_path) -> None:
    train, test = splits
    hparams = {**SMALL["lightgbm"], "bagging_fraction": 0.7}
    seen: list[int] = []

    def hook(step: int, models) -> list[float]:
        seen.append(len(models))
        return [0.0]

    hooks = TrainHooks(
        on_validation=hook, checkpoint=TrainingCheckpoint(tmp_path / "resume.pt", 10, {"run": 1})
    )
    models = MODELS["lightgbm"].train_seeds(train, test, SETTINGS, hparams, "fp32", "cpu", [0, 1], hooks)
    assert len(models) == 2 and seen == [1, 1]
    alone = train_forecaster(MODELS["lightgbm"], train, test, SETTINGS, hparams, "fp32", "cpu", 1)
    assert torch.equal(models[1].predict(test), alone.predict(test))
    assert not torch.equal(models[0].predict(test), models[1].predict(test))
    assert not list(tmp_path.iterdir())  # each seed's resume file is gone once it is trained

    assert MODELS["linear"].deterministic and not MODELS["mlp"].deterministic
    (ridge,) = MODELS["linear"].train_seeds(train, None, SETTINGS, SMALL["linear"], "fp32", "cpu", SEEDS)
    assert torch.equal(
        ridge.state["weights"],
        train_forecaster(MODELS["linear"], train, None, SETTINGS, SMALL["linear"]).state["weights"],
    )


def test_lightgbm_bins_its_rows_once_for_all_seeds_and_keeps_no_training_data(splits, monkeypatch) -> None:
    """One binned training Dataset (and one validation Dataset) serves every seed, and a finished booster holds
    no Dataset: the job's memory does not grow with its seeds (docs/PERFORMANCE.md "Bounded memory")."""
    import lightgbm

    train, test = splits
    built: list[int] = []
    construct = lightgbm.Dataset.construct

    def counting(self):
        if self._handle is None:
            built.append(self.num_data() if self.data is None else len(self.data))
        return construct(self)

    monkeypatch.setattr(lightgbm.Dataset, "construct", counting)
    hparams = {**SMALL["lightgbm"], "bagging_fraction": 0.7}
    models = MODELS["lightgbm"].train_seeds(train, test, SETTINGS, hparams, "fp32", "cpu", SEEDS)
    assert len(built) == 2  # the training rows and the validation rows, not once a seed
    assert len({m.predict(test).numpy().tobytes() for m in models}) == len(SEEDS)
    for model in models:  # a training booster keeps its train_set; one rebuilt from its model string has none
        (booster,) = [
            c.cell_contents
            for c in model.predictor.__closure__
            if isinstance(c.cell_contents, lightgbm.Booster)
        ]
        assert getattr(booster, "train_set", None) is None


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_recurrent_layer_is_torchs_under_vmap_too(kind: str) -> None:
    """`Recurrent` runs torch's fused kernel alone and a loop over rows under vmap: both are nn.LSTM / nn.GRU
    (same initial weights from the same seed, same outputs)."""
    import copy

    from torch.func import functional_call, stack_module_state

    from marketrl.models.lstm import Recurrent

    reference = {"lstm": nn.LSTM, "gru": nn.GRU}[kind]
    torch.manual_seed(0)
    layers = [Recurrent(kind, 5, 8, num_layers=2) for _ in range(3)]
    torch.manual_seed(0)
    first = reference(5, 8, 2, batch_first=True)
    assert first.state_dict().keys() == layers[0].state_dict().keys()
    assert all(map(torch.equal, first.state_dict().values(), layers[0].state_dict().values()))
    x = torch.randn(3, 4, 7, 5)
    params, buffers = stack_module_state(layers)
    template = copy.deepcopy(layers[0]).to("meta")
    looped = torch.vmap(lambda p, b, x: functional_call(template, (p, b), (x,)))(params, buffers, x)
    for i, layer in enumerate(layers):
        torch.testing.assert_close(looped[i], layer(x[i]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(layers[0](x[0]), first(x[0])[0], rtol=0, atol=0)


def test_on_the_cpu_only_the_mlp_vectorizes_its_seeds() -> None:
    from marketrl.loop.hparams import parse_hparams
    from marketrl.models import alstm, dlinear, gru, tcn, transformer
    from marketrl.models.supervised_trainer import vectorize_seeds

    def module(build, hparams_class):
        return build(parse_hparams(hparams_class, {"window": 4, "hidden_dim_base": 8}, "m"), 3)

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    looped = [
        module(gru.build, gru.RecurrentHParams),
        module(alstm.ALSTM, alstm.ALSTMHParams),
        module(transformer.TransformerRegressor, transformer.TransformerHParams),
        module(tcn.TCN, tcn.TCNHParams),
        module(dlinear.DLinear, dlinear.DLinearHParams),
    ]
    assert not any(vectorize_seeds(m, cpu) for m in looped)
    assert all(vectorize_seeds(m, cuda) for m in looped)
    assert vectorize_seeds(module(mlp_module.MLP, mlp_module.MLPHParams), cpu)
