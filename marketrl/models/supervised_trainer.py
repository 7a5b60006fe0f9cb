"""The supervised loop every torch model of the zoo trains with: minimise the squared error of the forward return.

Reads top to bottom like the agents' loops (docs/AGENTS.md "Loop anatomy") and uses the same shared hooks:
`PrecisionPlan` autocast and `OptimStep` (bf16 / fp16 + GradScaler / fp32), `DeviceMetrics` (one host read and
NaN check per ``check_every`` steps), `EvalSchedule` (periodic validation; the hook may raise to prune),
`resume_or_start` (resumable checkpoints) and `HardwareBudget.batch_size_bounds` (VRAM-aware batch cap).

* Batches are slices of one on-device permutation per epoch; no host sync inside the step loop.
* Early stopping looks at the validation loss only at the periodic validations; the best weights are restored.
* Determinism: initialisation, dropout and batch order all draw from RNGs seeded by ``seed`` (the caller's global
  RNG is left untouched), so on the CPU the same seed gives bit-identical weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gpu_utils import (
    DeviceMetrics,
    HardwareBudget,
    OptimStep,
    PrecisionError,
    PrecisionPlan,
    detect_precision,
    make_optimizer,
    resolve_precision,
    sample_bytes,
)
from marketrl.env import MarketData
from marketrl.loop.hparams import parse_hparams
from marketrl.loop.resume import resume_or_start
from marketrl.loop.schedule import EvalSchedule
from marketrl.models.base import (
    ModelSpec,
    NeuralHParams,
    Predictor,
    RunSettings,
    TrainedModel,
    TrainHooks,
    Trial,
)
from marketrl.models.supervised_data import SupervisedRows, training_rows

__all__ = [
    "BATCH_LIMITS",
    "ModelBuilder",
    "bytes_per_sample",
    "torch_model_spec",
    "train_torch",
]

#: (smallest, largest) minibatch the budget may choose between; the tuned batch_size is capped by the budget.
BATCH_LIMITS = (8, 65_536)
#: Offset of the batch-order generator's seed from the run seed (init and dropout draw from ``seed`` itself).
ORDER_SEED_OFFSET = 7919

#: build(hparams, n_features) -> module mapping windows [B, window, F] to predictions [B]
ModelBuilder = Callable[[Any, int], nn.Module]


def bytes_per_sample(module: nn.Module, window: int, n_features: int, plan: PrecisionPlan) -> int:
    """Measured activation bytes of one sample: every leaf module's output elements in one forward pass of a
    probe batch (`gpu_utils.sample_bytes` adds the safety factor), plus the window's fp32 input values."""
    probe = 2
    elements = 0

    def count(_module: nn.Module, _inputs: Any, output: Any) -> None:
        nonlocal elements
        stack = [output]
        while stack:
            item = stack.pop()
            if isinstance(item, torch.Tensor):
                elements += item.numel()
            elif isinstance(item, list | tuple):
                stack.extend(item)

    leaves = [m for m in module.modules() if not any(True for _ in m.children())]
    handles = [leaf.register_forward_hook(count) for leaf in leaves]
    was_training = module.training
    try:
        module.eval()  # eval: dropout draws no random numbers, so measuring leaves every RNG untouched
        device = next(module.parameters()).device
        with torch.no_grad(), plan.autocast():
            module(torch.zeros(probe, window, n_features, device=device))
    finally:
        for handle in handles:
            handle.remove()
        module.train(was_training)
    return sample_bytes(math.ceil(elements / probe), window * n_features + 1, plan)


class TargetScaled(nn.Module):
    """A zoo module trained on targets divided by their training standard deviation (forward returns are tiny
    numbers; unit-scale targets keep the output layer's initial scale right). ``scale`` is a buffer, so the
    checkpoint's state_dict carries it; `make_predictor` multiplies it back."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.register_buffer("scale", torch.ones(()))

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        """Predictions [B] in units of ``scale``."""
        return self.module(windows).reshape(-1)


class _GlobalRng:
    """The torch global RNG (dropout draws from it) as a resumable component."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def state_dict(self) -> dict[str, Any]:
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return {"cpu": torch.get_rng_state(), "cuda": cuda}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        torch.set_rng_state(state["cpu"])
        if state["cuda"] is not None:
            torch.cuda.set_rng_state(state["cuda"], self.device)


@contextlib.contextmanager
def _private_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's global RNG for the run and restore the caller's afterwards."""
    cuda_devices = []
    if device.type == "cuda":
        cuda_devices = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(seed)
        yield


def make_predictor(module: TargetScaled, plan: PrecisionPlan) -> Predictor:
    """windows -> predicted forward returns: the module in eval mode under the plan's autocast, fp32, rescaled."""

    def predict(windows: torch.Tensor) -> torch.Tensor:
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad(), plan.autocast():
                return module(windows).float() * module.scale
        finally:
            module.train(was_training)

    return predict


@dataclass
class LoopState:
    """The loop's own variables (saved and restored with the resume file)."""

    step: int = 0
    order: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    best_loss: float = math.inf
    best_step: int = 0
    bad_validations: int = 0
    stopped_at: int | None = None
    best_weights: dict[str, torch.Tensor] | None = None


def validation_loss(predictor: Predictor, rows: SupervisedRows) -> float:
    """Mean squared error of the forward-return predictions on the validation rows (one host read)."""
    total = torch.zeros((), dtype=torch.float64, device=rows.target.device)
    for part in rows.chunks():
        windows, target = rows.batch(part)
        total += (predictor(windows) - target).double().square().sum()
    return float(total) / rows.n_rows


def train_torch(
    name: str,
    hparams_class: type,
    build: ModelBuilder,
    train_data: MarketData,
    validation_data: MarketData | None,
    settings: RunSettings,
    hparams: Mapping[str, Any] | None,
    precision: PrecisionPlan | str,
    device: torch.device | str,
    seed: int,
    hooks: TrainHooks | None = None,
) -> TrainedModel:
    """Train one torch model of the zoo (see the module docstring); ``build(hp, n_features)`` makes the module."""
    hooks = hooks or TrainHooks()
    hp = parse_hparams(hparams_class, hparams, name)
    device = torch.device(device)
    plan = resolve_precision(precision, device)
    train_data = _on(train_data, device)
    validation_data = _on(validation_data, device) if validation_data is not None else None
    rows = training_rows(train_data, hp.window, settings.horizon)
    val_rows = None
    if validation_data is not None:
        val_rows = SupervisedRows.build(validation_data, hp.window, settings.horizon)
        val_rows = val_rows if val_rows.n_rows else None
    n_features = train_data.n_features

    with _private_rng(seed, device):
        module = TargetScaled(build(hp, n_features)).to(device)
        module.scale.copy_(rows.target.index_select(0, rows.rows).std(correction=0).clamp_min(1e-12))
        parameter_count = sum(p.numel() for p in module.parameters())
        largest = _largest_batch(
            hooks.budget or HardwareBudget.detect(device), module, hp, n_features, plan, train_data, name
        )
        batch_size = max(1, min(hp.batch_size, largest, rows.n_rows))
        steps_per_epoch = math.ceil(rows.n_rows / batch_size)
        total_steps = settings.epochs * steps_per_epoch
        if settings.max_steps is not None:
            total_steps = min(total_steps, settings.max_steps)

        optimizer = make_optimizer(
            module.parameters(), hp.learning_rate, plan, device, weight_decay=hp.weight_decay
        )
        stepper = OptimStep(optimizer, plan, hp.max_grad_norm)
        metrics = DeviceMetrics(
            ["loss", "grad_norm", "prediction_std"], device, watched=("loss",), capacity=settings.check_every
        )
        generator = torch.Generator(device=device).manual_seed(seed + ORDER_SEED_OFFSET)
        state = LoopState(order=torch.zeros(0, dtype=torch.int64, device=device))
        predictor = make_predictor(module, plan)

        def snapshot() -> TrainedModel:
            return _trained(name, hp, n_features, predictor, module, settings, plan, {})

        def on_validation(step: int, _policy: Any) -> float | None:
            if val_rows is not None:
                loss = validation_loss(predictor, val_rows)
                if loss < state.best_loss:
                    state.best_loss, state.best_step, state.bad_validations = loss, step, 0
                    state.best_weights = {
                        key: value.detach().clone() for key, value in module.state_dict().items()
                    }
                else:
                    state.bad_validations += 1
                    if settings.patience and state.bad_validations >= settings.patience:
                        state.stopped_at = step
                run.log({"step": step, "validation_loss": loss})
            return hooks.on_validation(step, snapshot()) if hooks.on_validation is not None else None

        validations = EvalSchedule(
            on_validation if val_rows is not None or hooks.on_validation else None, settings.eval_every
        )
        run = resume_or_start(
            hooks.checkpoint,
            {
                "model": module,
                "optim": stepper,
                "metrics": metrics,
                "validations": validations,
                "generator": generator,
                "global_rng": _GlobalRng(device),
            },
            state,
            total_steps=total_steps,
            device=device,
        )

        module.train()
        for step in range(state.step, total_steps):
            if state.stopped_at is not None:
                break
            position = step % steps_per_epoch
            if position == 0:
                state.order = torch.randperm(rows.n_rows, generator=generator, device=device)
            batch_rows = rows.rows.index_select(
                0, state.order[position * batch_size : (position + 1) * batch_size]
            )
            windows, target = rows.batch(batch_rows)
            with stepper.autocast():
                prediction = module(windows).float().reshape(-1)
            loss = (prediction - target / module.scale).square().mean()
            grad_norm = stepper.step(loss)
            metrics.record([loss.detach(), grad_norm, prediction.detach().std(correction=0)])
            state.step = step + 1

            if state.step % settings.check_every == 0:
                _read(run, metrics, state.step, hooks)
            validations.maybe(state.step, None)
            run.maybe_save(state.step)

        if metrics.pending:
            _read(run, metrics, state.step, hooks)
        validations.final(state.step, None)
        summary = run.finish(state.step)
        if state.best_weights is not None:
            module.load_state_dict(state.best_weights)

    log = {
        "model": name,
        "steps": state.step,
        "total_steps": total_steps,
        "steps_per_epoch": steps_per_epoch,
        "batch_size": batch_size,
        "batch_size_max": largest,
        "parameter_count": parameter_count,
        "train_rows": rows.n_rows,
        "best_validation_loss": None if math.isinf(state.best_loss) else state.best_loss,
        "best_step": state.best_step,
        "stopped_at": state.stopped_at,
        "steps_per_second": summary["steps_per_second"],
        "statistics_reads": metrics.host_reads,
        "evals": validations.records,
        "history": summary["history"],
    }
    return _trained(name, hp, n_features, predictor, module, settings, plan, log)


def _largest_batch(
    budget: HardwareBudget,
    module: nn.Module,
    hp: NeuralHParams,
    n_features: int,
    plan: PrecisionPlan,
    data: MarketData,
    name: str,
) -> int:
    """The largest batch the device's memory holds next to the model and the split's feature table."""
    _, largest = budget.batch_size_bounds(
        sum(p.numel() for p in module.parameters()),
        bytes_per_sample(module, hp.window, n_features, plan),
        limits=BATCH_LIMITS,
        buffer_bytes=data.features.numel() * 4,
        what=f"{name} with window={hp.window}, hidden_dim_base={hp.hidden_dim_base}",
    )
    return largest


def _on(data: MarketData, device: torch.device) -> MarketData:
    """The data on ``device`` (moved only when it is elsewhere)."""
    return data if data.device == device else data.to(device)


def _read(run: Any, metrics: DeviceMetrics, step: int, hooks: TrainHooks) -> None:
    record = {"step": step, **metrics.read(step)}
    run.log(record)
    if hooks.log is not None:
        hooks.log(record)


def _trained(
    name: str,
    hp: Any,
    n_features: int,
    predictor: Predictor,
    module: nn.Module,
    settings: RunSettings | Mapping[str, Any],
    plan: PrecisionPlan,
    log: dict[str, Any],
) -> TrainedModel:
    return TrainedModel(
        name=name,
        hparams=dataclasses.asdict(hp),
        n_features=n_features,
        predictor=predictor,
        state={"state_dict": module.state_dict()},  # live views; `TrainedModel.checkpoint` copies them out
        settings=settings.to_dict() if isinstance(settings, RunSettings) else dict(settings),
        precision=plan.to_dict(),
        log=log,
    )


def load_torch(
    name: str,
    hparams_class: type,
    build: ModelBuilder,
    checkpoint: Mapping[str, Any],
    device: torch.device | str,
) -> TrainedModel:
    """Rebuild a trained torch model from its checkpoint dict, in its training precision where the device can."""
    device = torch.device(device)
    hp = parse_hparams(hparams_class, checkpoint["hparams"], name)
    module = TargetScaled(build(hp, int(checkpoint["n_features"]))).to(device)
    module.load_state_dict(checkpoint["state"]["state_dict"])
    module.eval()
    try:
        plan = detect_precision(device, checkpoint["precision"].get("mode", "fp32"))
    except PrecisionError:
        plan = detect_precision(device, "fp32")
    return _trained(
        name,
        hp,
        int(checkpoint["n_features"]),
        make_predictor(module, plan),
        module,
        checkpoint["settings"],
        plan,
        {},
    )


def torch_model_spec(
    name: str, hparams_class: type, search_space: Callable[[Trial], dict[str, Any]], build: ModelBuilder
) -> ModelSpec:
    """The registry entry of a torch model: the shared trainer and loader bound to its config and module."""
    if not issubclass(hparams_class, NeuralHParams):
        raise TypeError(f"{name}: hyperparameters must extend NeuralHParams")

    def train(*args: Any, **kwargs: Any) -> TrainedModel:
        return train_torch(name, hparams_class, build, *args, **kwargs)

    def load(checkpoint: Mapping[str, Any], device: torch.device | str = "cpu") -> TrainedModel:
        return load_torch(name, hparams_class, build, checkpoint, device)

    return ModelSpec(name, hparams_class, search_space, train, load, neural=True)
