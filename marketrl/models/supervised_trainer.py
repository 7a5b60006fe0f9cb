"""The supervised loop every torch model of the zoo trains with: minimise the squared error of the forward return.

It trains S seeds of one model as one computation (`train_torch_seeds`; one seed is a batch of one): the
seeds' modules are stacked on a leading seed axis (`ForecasterSeeds`, `gpu_utils.stack_modules`) and run through
`torch.func.functional_call` under `torch.vmap` (on the CPU, where that only pays for the MLP, the seeds' forward
passes run one after another instead: `vectorize_seeds`); one `gpu_utils.SeedOptimStep` (Adam over the stacked leaves, clip
per seed) sums the S per-seed losses for one backward, so each seed gets exactly its own gradient.

Reads top to bottom like the agents' loops (docs/AGENTS.md "Loop anatomy") and uses the same shared hooks:
`PrecisionPlan` autocast (bf16 / fp16 + GradScaler / fp32), `DeviceMetrics` (one host read and NaN check per
``check_every`` steps for the whole batch; the error names the seed), periodic validation (every ``eval_every``
steps and at the end, one host read for all seeds; the hook may raise to prune), `resume_or_start` (one resumable
checkpoint for the batch, holding the stacked state) and `HardwareBudget.batch_size_bounds` (VRAM-aware batch cap
for S copies).

* Per seed: initialisation (drawn under its own seed), batch order (its own generator, seed + ORDER_SEED_OFFSET),
  target scale, gradient clip, validation losses, best-weights snapshot, early stop and log.
* Batches are slices of one on-device permutation per seed and epoch; no host sync inside the step loop.
* Early stopping looks at each seed's validation loss at the periodic validations; a seed whose patience ran out
  stops moving (the optimizer's ``active`` mask holds its weights and Adam state bit for bit) and gets its best
  weights back; the loop runs until every seed stopped or the step budget is spent.
* Dropout: every seed's masks come from one stream seeded by the batch's first seed (under vmap,
  ``randomness="different"`` draws [S, ...] at once; otherwise seed after seed), so a seed's masks depend on its
  position in the batch and on ``seeds[0]``, never on another seed's weights or data.
* Determinism: the same seeds in the same order give bit-identical weights on the CPU; the caller's global RNG is
  left untouched.
* Folds on the batch axis (``block_rows``, ``block_validation``; training.batch_folds): the seeds of each fold
  form a group with its own rows of the stacked table, target scale, batch size, steps per epoch, step budget,
  validation split and validation steps (`marketrl.models.seed_rows`); a group's run ends at its own budget or
  when all its seeds stopped, and its seeds then stop moving, as alone. A group's end also closes the statistics
  window (one read more than the ``check_every`` cadence per fold). Dropout masks still come from the batch's one
  stream, so with dropout a fold draws other masks than alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from gpu_utils import (
    BudgetError,
    DeviceMetrics,
    HardwareBudget,
    PrecisionError,
    PrecisionPlan,
    detect_precision,
    resolve_precision,
    sample_bytes,
)
from gpu_utils.seeds import SeedOptimStep
from marketrl.env import MarketData
from marketrl.loop.hparams import parse_hparams
from marketrl.loop.profile import ModelProfile, TrialCost, TrialSizes
from marketrl.loop.resume import resume_or_start
from marketrl.models.base import (
    FORECASTER_TRIAL_OVERHEAD,
    ModelSpec,
    NeuralHParams,
    Predictor,
    RunSettings,
    TrainedModel,
    TrainHooks,
    Trial,
    distinct_seeds,
)
from marketrl.models.forecaster_seeds import ForecasterSeeds, vectorize_seeds
from marketrl.models.seed_rows import BlockBatches, SeedValidationRows, SharedBatches, schedule
from marketrl.models.supervised_data import SupervisedRows, forward_returns, training_rows

__all__ = [
    "BATCH_LIMITS",
    "SMALL_HPARAMS",
    "STEP_OVERHEAD",
    "ForecasterSeeds",
    "ModelBuilder",
    "bytes_per_sample",
    "seed_validation_losses",
    "torch_folds_per_batch",
    "torch_model_spec",
    "torch_trial_cost",
    "train_torch_seeds",
    "validation_losses",
    "vectorize_seeds",
]

#: (smallest, largest) minibatch the budget may choose between; the tuned batch_size is capped by the budget.
BATCH_LIMITS = (8, 65_536)
#: Offset of the batch-order generator's seed from the run seed (init and dropout draw from ``seed`` itself).
ORDER_SEED_OFFSET = 7919

#: build(hparams, n_features) -> module mapping windows [B, window, F] to predictions [B]
ModelBuilder = Callable[[Any, int], nn.Module]
#: The torch models' small hyperparameters for the unit tests (their `ModelProfile.small`).
SMALL_HPARAMS: Mapping[str, Any] = MappingProxyType(
    {"window": 4, "hidden_dim_base": 8, "batch_size": 32, "learning_rate": 1e-2}
)
#: A torch forecaster's price per row (and per window row of a sequence model) beyond its multiply-adds, in
#: `ModelProfile.trial_cost` units: small matrices have a fixed price too (an LSTM's width 16 -> 32 cost 1.4x,
#: its multiply-adds 2.5x; bench/speed/hyperopt_cost.py).
STEP_OVERHEAD = 12_000


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
            if isinstance(item, torch.Tensor):  # a layer that keeps more than its output for backward says so
                elements += item.numel() * getattr(_module, "saved_per_output", 1)
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
    """The loop's own variables (saved and restored with the resume file); lists hold one entry per seed."""

    step: int = 0
    order: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.int64))
    best_loss: list[float] = field(default_factory=list)
    best_step: list[int] = field(default_factory=list)
    bad_validations: list[int] = field(default_factory=list)
    stopped_at: list[int | None] = field(default_factory=list)
    evals: list[list[list[float | None]]] = field(default_factory=list)
    #: the stacked state_dict where each seed holds its best validation's weights
    best_weights: dict[str, torch.Tensor] | None = None


def validation_losses(stack: ForecasterSeeds, plan: PrecisionPlan, rows: SupervisedRows) -> list[float]:
    """Each seed's mean squared error of the forward-return predictions on the validation rows (one host read)."""
    total = torch.zeros(stack.n_seeds, dtype=torch.float64, device=rows.target.device)
    scale = stack.stacked()[1]["scale"].reshape(-1, 1)
    was_training = stack.training
    stack.eval()
    try:
        for part in rows.chunks():
            windows, target = rows.batch(part)
            with torch.no_grad(), plan.autocast():
                prediction = stack(windows, shared=True).float() * scale
            total += (prediction - target).double().square().sum(dim=1)
    finally:
        stack.train(was_training)
    return [value / rows.n_rows for value in total.tolist()]


def train_torch_seeds(
    name: str,
    hparams_class: type,
    build: ModelBuilder,
    train_data: MarketData,
    validation_data: MarketData | None,
    settings: RunSettings,
    hparams: Mapping[str, Any] | None,
    precision: PrecisionPlan | str,
    device: torch.device | str,
    seeds: Sequence[int],
    hooks: TrainHooks | None = None,
    *,
    block_rows: Sequence[tuple[int, int]] | None = None,
    block_validation: Sequence[MarketData | None] | None = None,
) -> list[TrainedModel]:
    """Train S seeds of one torch model of the zoo as one vectorized computation (see the module docstring);
    ``build(hp, n_features)`` makes the module. Returns one model per seed, in the order of ``seeds``.

    Folds on the batch axis (training.batch_folds): ``block_rows[i]`` are seed i's rows [start, stop) of the
    stacked ``train_data`` and ``block_validation[i]`` its own validation split (``validation_data`` unused);
    each seed then trains, validates and stops as a run on its fold alone would (`marketrl.models.seed_rows`)."""
    hooks = hooks or TrainHooks()
    seeds = distinct_seeds(seeds)
    n_seeds = len(seeds)
    hp = parse_hparams(hparams_class, hparams, name)
    device = torch.device(device)
    plan = resolve_precision(precision, device)
    train_data = _on(train_data, device)
    n_features = train_data.n_features
    if block_rows is None:
        rows_of = [training_rows(train_data, hp.window, settings.horizon, settings.max_train_rows)] * n_seeds
        group_of = [0] * n_seeds
        val_rows = _shared_validation(validation_data, device, hp.window, settings.horizon)
    else:
        if len(block_rows) != n_seeds or block_validation is None or len(block_validation) != n_seeds:
            raise ValueError(f"{name}: expected one row range and one validation split per seed ({n_seeds})")
        rows_of, group_of = _block_rows(train_data, block_rows, hp.window, settings)
        splits = [_on(split, device) if split is not None else None for split in block_validation]
        val_rows = _block_validation(splits, hp.window, settings.horizon)
    n_groups = max(group_of) + 1
    groups = [[i for i in range(n_seeds) if group_of[i] == g] for g in range(n_groups)]

    modules = []
    for seed in seeds:  # each seed's initialization from its own seed, as a single run draws it
        with _private_rng(seed, device):
            modules.append(TargetScaled(build(hp, n_features)).to(device))
    scales = {}
    for module, rows in zip(modules, rows_of, strict=True):  # each seed's target scale from its own rows
        if id(rows) not in scales:
            scales[id(rows)] = rows.target.index_select(0, rows.rows).std(correction=0).clamp_min(1e-12)
        module.scale.copy_(scales[id(rows)])
    parameter_count = sum(p.numel() for p in modules[0].parameters())
    largest = _largest_batch(
        hooks.budget or HardwareBudget.detect(device),
        modules[0],
        hp,
        n_features,
        plan,
        train_data,
        name,
        n_seeds,
    )
    plans = [
        schedule(rows, group_of[i], hp.batch_size, largest, settings.epochs, settings.max_steps)
        for i, rows in enumerate(rows_of)
    ]
    group_total = [plans[members[0]].total_steps for members in groups]

    vectorize = vectorize_seeds(modules[0], device)
    stack = ForecasterSeeds(modules, vectorize)
    stepper = SeedOptimStep.adam(
        stack.parameters(),
        hp.learning_rate,
        plan,
        hp.max_grad_norm,
        n_seeds=n_seeds,
        weight_decay=hp.weight_decay,
    )
    # one column per statistic and seed ("seed 7: loss"), so the NaN check names the seed
    columns = [f"seed {seed}: {stat}" for seed in seeds for stat in STATISTICS]
    metrics = DeviceMetrics(
        columns, device, watched=[c for c in columns if c.endswith(": loss")], capacity=settings.check_every
    )
    generators = {
        f"generator_{i}": torch.Generator(device=device).manual_seed(seed + ORDER_SEED_OFFSET)
        for i, seed in enumerate(seeds)
    }
    batches = (
        SharedBatches(plans[0], list(generators.values()))
        if block_rows is None
        else BlockBatches(plans, list(generators.values()))
    )
    state = LoopState(
        order=batches.initial_order(),
        best_loss=[math.inf] * n_seeds,
        best_step=[0] * n_seeds,
        bad_validations=[0] * n_seeds,
        stopped_at=[None] * n_seeds,
        evals=[[] for _ in seeds],
    )

    def ended(group: int) -> bool:
        """A seed group's run is over: its budget spent, or every seed of it stopped early."""
        return state.step >= group_total[group] or all(state.stopped_at[i] is not None for i in groups[group])

    def snapshots(due: list[bool]) -> list[TrainedModel | None]:
        models: list[TrainedModel | None] = []
        for i, module in enumerate(modules):
            if not due[i]:
                models.append(None)
                continue
            module.load_state_dict(stack.seed_state(i))
            models.append(
                _trained(name, hp, n_features, make_predictor(module, plan), module, settings, plan, {})
            )
        return models

    def on_validation(step: int, due_groups: list[int]) -> None:
        due = [group_of[i] in due_groups for i in range(n_seeds)]
        running = [d and stopped is None for d, stopped in zip(due, state.stopped_at, strict=True)]
        if val_rows is not None:
            losses = (
                validation_losses(stack, plan, val_rows)
                if isinstance(val_rows, SupervisedRows)
                else seed_validation_losses(stack, plan, val_rows)
            )
            improved = [
                go and loss is not None and loss < best
                for go, loss, best in zip(running, losses, state.best_loss, strict=True)
            ]
            for i, loss in enumerate(losses):
                if not running[i] or loss is None:
                    continue
                if improved[i]:
                    state.best_loss[i], state.best_step[i], state.bad_validations[i] = loss, step, 0
                else:
                    state.bad_validations[i] += 1
                    if settings.patience and state.bad_validations[i] >= settings.patience:
                        state.stopped_at[i] = step
            if any(improved):
                _keep_best(state, stack, improved)
            run.log(
                {"step": step, "validation_loss": [loss if due[i] else None for i, loss in enumerate(losses)]}
            )
        scores = hooks.on_validation(step, snapshots(due)) if hooks.on_validation is not None else None
        for i in range(n_seeds):
            if running[i]:
                state.evals[i].append(
                    [step, None if scores is None or scores[i] is None else float(scores[i])]
                )

    validating = val_rows is not None or hooks.on_validation is not None
    active_masks: dict[tuple[bool, ...], torch.Tensor] = {}

    def active(live: list[int]) -> torch.Tensor | None:
        """The [S] mask of seeds still training (their group in ``live``, not stopped), or None while all are (no
        masking cost)."""
        running = set(live)
        key = tuple(state.stopped_at[i] is None and group_of[i] in running for i in range(n_seeds))
        if all(key):
            return None
        if key not in active_masks:
            active_masks[key] = torch.tensor(key, device=device)
        return active_masks[key]

    with _private_rng(seeds[0], device):  # dropout: every seed draws its masks from this one stream
        run = resume_or_start(
            hooks.checkpoint,
            {
                "model": stack,
                "optim": stepper,
                "metrics": metrics,
                **generators,
                "global_rng": _GlobalRng(device),
            },
            state,
            total_steps=max(group_total),
            device=device,
        )

        stack.train()
        for step in range(state.step, max(group_total)):
            live = [g for g in range(n_groups) if not ended(g)]
            if not live:
                break
            windows, target, valid, state.order = batches.draw(step, state.order)
            with stepper.autocast():
                prediction = stack(windows).float().reshape(n_seeds, -1)
            scale = stack.stacked()[1]["scale"].reshape(-1, 1)
            error = (prediction - target / scale).square()
            if valid is None:
                loss = error.mean(dim=1)
                spread = prediction.detach().std(dim=1, correction=0)
            else:  # padded rows count nowhere
                weight = valid.to(error.dtype)
                count = weight.sum(dim=1)
                loss = (error * weight).sum(dim=1) / count
                mean = (prediction.detach() * weight).sum(dim=1, keepdim=True) / count[:, None]
                spread = (((prediction.detach() - mean).square() * weight).sum(dim=1) / count).sqrt()
            grad_norm = stepper.step(loss, active=active(live))
            metrics.record(list(torch.stack([loss.detach(), grad_norm, spread], 1).reshape(-1).unbind()))
            state.step = step + 1

            finishing = any(state.step == group_total[g] for g in live)
            if state.step % settings.check_every == 0 or finishing:  # a group's end closes its last window
                _read(run, metrics, state.step, hooks, seeds)
            if validating:
                due = [
                    g
                    for g in live
                    if (settings.eval_every and state.step % settings.eval_every == 0)
                    or state.step == group_total[g]
                ]
                if due:
                    on_validation(state.step, due)
            run.maybe_save(state.step)

        if metrics.pending:
            _read(run, metrics, state.step, hooks, seeds)
        summary = run.finish(state.step)

    results = []
    for i, module in enumerate(modules):
        best = state.best_weights is not None and not math.isinf(state.best_loss[i])
        module.load_state_dict(
            {key: value[i].clone() for key, value in state.best_weights.items()}
            if best
            else stack.seed_state(i)
        )
        stopped, own = state.stopped_at[i], plans[i]
        end = min(state.step, own.total_steps)
        log = {
            "model": name,
            "steps": end if stopped is None else stopped,
            "total_steps": own.total_steps,
            "steps_per_epoch": own.steps_per_epoch,
            "batch_size": own.batch_size,
            "batch_size_max": largest,
            "parameter_count": parameter_count,
            "train_rows": own.rows.n_rows,
            "best_validation_loss": None if math.isinf(state.best_loss[i]) else state.best_loss[i],
            "best_step": state.best_step[i],
            "stopped_at": stopped,
            # batch-wide: the batch's speed and reads (one read serves every seed), and the batch size bound
            "batch_seeds": n_seeds,
            "seed_axis": "vmap" if stack.vectorize else "loop",
            "steps_per_second": summary["steps_per_second"],
            "statistics_reads": metrics.host_reads,
            "evals": state.evals[i],
            "history": _seed_history(summary["history"], seeds[i], i, stopped, settings.check_every, end),
        }
        results.append(
            _trained(name, hp, n_features, make_predictor(module, plan), module, settings, plan, log)
        )
    return results


def _shared_validation(
    data: MarketData | None, device: torch.device, window: int, horizon: int
) -> SupervisedRows | None:
    """Every seed's validation rows of one split (None: no split, or no usable row in it)."""
    if data is None:
        return None
    rows = SupervisedRows.build(_on(data, device), window, horizon)
    return rows if rows.n_rows else None


def _block_rows(
    data: MarketData, block_rows: Sequence[tuple[int, int]], window: int, settings: RunSettings
) -> tuple[list[SupervisedRows], list[int]]:
    """Each seed's training rows of the stacked table (one object per distinct range) and its group (the index
    of its distinct range: the run it would be alone)."""
    target = forward_returns(data, settings.horizon)
    distinct: dict[tuple[int, int], tuple[SupervisedRows, int]] = {}
    for start, stop in block_rows:
        key = (int(start), int(stop))
        if key not in distinct:
            rows = training_rows(data, window, settings.horizon, settings.max_train_rows, key, target)
            distinct[key] = (rows, len(distinct))
    picked = [distinct[(int(start), int(stop))] for start, stop in block_rows]
    return [rows for rows, _ in picked], [group for _, group in picked]


def _block_validation(
    splits: list[MarketData | None], window: int, horizon: int
) -> SeedValidationRows | None:
    """Each seed's validation rows of its own split; every seed has a split or none has."""
    present = [split is not None for split in splits]
    if not any(present):
        return None
    if not all(present):
        raise ValueError("block_validation: every seed has a validation split or none has")
    return SeedValidationRows.build(splits, window, horizon)  # type: ignore[arg-type]


def seed_validation_losses(
    stack: ForecasterSeeds, plan: PrecisionPlan, rows: SeedValidationRows
) -> list[float | None]:
    """Each seed's mean squared error of the forward-return predictions on its own validation rows (one host
    read); None for a seed whose split has no usable row."""
    total = torch.zeros(stack.n_seeds, dtype=torch.float64, device=rows.target.device)
    scale = stack.stacked()[1]["scale"].reshape(-1, 1)
    was_training = stack.training
    stack.eval()
    try:
        for windows, target, valid in rows.chunks():
            with torch.no_grad(), plan.autocast():
                prediction = stack(windows).float() * scale
            total += ((prediction - target).double().square() * valid).sum(dim=1)
    finally:
        stack.train(was_training)
    return [
        value / count if count else None for value, count in zip(total.tolist(), rows.counts, strict=True)
    ]


#: the per-step statistics each seed records
STATISTICS = ("loss", "grad_norm", "prediction_std")


def _keep_best(state: LoopState, stack: ForecasterSeeds, improved: list[bool]) -> None:
    """Copy the improved seeds' current weights into the stacked best-weights snapshot."""
    params, buffers = stack.stacked()
    current = {**params, **buffers}
    if state.best_weights is None:
        state.best_weights = {key: value.detach().clone() for key, value in current.items()}
        return
    mask = torch.tensor(improved, device=next(iter(current.values())).device)
    for key, value in current.items():
        keep = mask.reshape(-1, *([1] * (value.dim() - 1)))
        state.best_weights[key] = torch.where(keep, value.detach(), state.best_weights[key])


def _seed_history(
    history: list[dict[str, Any]],
    seed: int,
    index: int,
    stopped: int | None,
    check_every: int,
    end: int | None = None,
) -> list[dict[str, Any]]:
    """Seed ``index``'s own records from the batch's: its statistics columns and validation loss, up to the read
    that covers its early stop (after it, its weights no longer move) and none after ``end``, its last step (a
    fold that ends before others on the batch axis)."""
    prefix = f"seed {seed}: "
    out = []
    for record in history:
        if stopped is not None and record["step"] >= stopped + check_every:
            break
        if end is not None and record["step"] > end:
            break
        if "validation_loss" in record:
            if record["validation_loss"][index] is None:  # not its validation (another fold's step)
                continue
            if stopped is None or record["step"] <= stopped:
                out.append({"step": record["step"], "validation_loss": record["validation_loss"][index]})
            continue
        own = {key[len(prefix) :]: value for key, value in record.items() if key.startswith(prefix)}
        out.append({"step": record["step"], **own, "count": record["count"]})
    return out


def _largest_batch(
    budget: HardwareBudget,
    module: nn.Module,
    hp: NeuralHParams,
    n_features: int,
    plan: PrecisionPlan,
    data: MarketData,
    name: str,
    n_seeds: int = 1,
    tables: int = 1,
) -> int:
    """The largest per-seed batch the device's memory holds for S copies (parameters, optimizer state and
    activations each S times) next to ``tables`` feature tables of the split's size (shared by all seeds)."""
    _, largest = budget.batch_size_bounds(
        n_seeds * sum(p.numel() for p in module.parameters()),
        n_seeds * bytes_per_sample(module, hp.window, n_features, plan),
        limits=BATCH_LIMITS,
        buffer_bytes=tables * data.features.numel() * 4,
        what=f"{name} with window={hp.window}, hidden_dim_base={hp.hidden_dim_base}, {n_seeds} seed(s)",
    )
    return largest


def torch_folds_per_batch(
    name: str,
    hparams_class: type,
    build: ModelBuilder,
    budget: HardwareBudget,
    train_data: MarketData,
    hparams: Mapping[str, Any],
    precision: PrecisionPlan | str,
    seeds_per_fold: int,
    n_folds: int,
) -> int:
    """How many folds of ``seeds_per_fold`` seeds (training tables of ``train_data``'s size) one batch of this
    model holds in ``budget``: the most, up to ``n_folds``, whose copies and tables leave room for the batch one
    fold trains with alone (so every seed keeps its batch size); at least 1."""
    hp = parse_hparams(hparams_class, hparams, name)
    plan = (
        precision
        if isinstance(precision, PrecisionPlan)
        else detect_precision(torch.device("cpu"), precision)
    )
    with torch.random.fork_rng(devices=[]):  # a probe module: the caller's RNG stays untouched
        module = TargetScaled(build(hp, train_data.n_features))
    try:
        alone = _largest_batch(
            budget, module, hp, train_data.n_features, plan, train_data, name, seeds_per_fold
        )
    except BudgetError:
        return 1  # one fold trains as it always does, and fails there if it does not fit
    wanted = min(hp.batch_size, alone)
    for n in range(n_folds, 1, -1):
        try:
            largest = _largest_batch(
                budget, module, hp, train_data.n_features, plan, train_data, name, n * seeds_per_fold, n
            )
        except BudgetError:
            continue
        if largest >= wanted:
            return n
    return 1


def _on(data: MarketData, device: torch.device) -> MarketData:
    """The data on ``device`` (moved only when it is elsewhere)."""
    return data if data.device == device else data.to(device)


def _read(run: Any, metrics: DeviceMetrics, step: int, hooks: TrainHooks, seeds: Sequence[int]) -> None:
    record = {"step": step, **metrics.read(step)}
    run.log(record)
    if hooks.log is not None:
        for i, seed in enumerate(seeds):
            own = _seed_history([record], seed, i, None, 1)[0]
            hooks.log({**own, "seed": seed})


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
        module=_Rescaled(module),
    )


class _Rescaled(nn.Module):
    """A `TargetScaled` module with its scale multiplied back: what `make_predictor` computes, in fp32 (export)."""

    def __init__(self, module: TargetScaled) -> None:
        super().__init__()
        self.model = module

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        """Predicted forward returns [B] float32."""
        return self.model(windows).float() * self.model.scale


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


def torch_trial_cost(multiply_adds: Callable[[Mapping[str, Any], int], int], *, sequence: bool) -> TrialCost:
    """The `ModelProfile.trial_cost` of a model this loop trains: a fixed overhead plus samples processed x work per
    sample. ``multiply_adds(hparams, n_features)``: one sample's forward pass; ``sequence``: the model steps over
    the window's rows (each pays `STEP_OVERHEAD`). Samples: min(updates x batch, epochs x rows), three passes
    each (forward and backward), plus the validations' two forward passes (the loss, then the trading rule's
    positions) over the validation rows, ten per full run. A space that does not tune ``batch_size`` trains at
    `NeuralHParams`'s default."""

    def trial_cost(hp: Mapping[str, Any], s: TrialSizes) -> float:
        per_sample = STEP_OVERHEAD * (hp["window"] if sequence else 1) + multiply_adds(hp, s.features)
        batch = hp.get("batch_size", NeuralHParams.batch_size)
        steps = min(s.trial_updates, s.epochs * math.ceil(s.train_rows / batch))
        samples = min(steps * batch, s.epochs * s.train_rows)
        validations = min(10, steps // max(1, s.trial_updates // 10))  # fewer when it ends early
        work = (3 * samples + 2 * validations * s.validation_rows) * per_sample
        return FORECASTER_TRIAL_OVERHEAD + float(work)

    return trial_cost


def torch_model_spec(
    name: str,
    hparams_class: type,
    search_space: Callable[[Trial], dict[str, Any]],
    build: ModelBuilder,
    profile: ModelProfile | None = None,
) -> ModelSpec:
    """The registry entry of a torch model: the shared trainer and loader bound to its config and module, and its
    `ModelProfile` (bounds, trial cost, small test sizes, docs row)."""
    if not issubclass(hparams_class, NeuralHParams):
        raise TypeError(f"{name}: hyperparameters must extend NeuralHParams")

    def train_seeds(*args: Any, **kwargs: Any) -> list[TrainedModel]:
        return train_torch_seeds(name, hparams_class, build, *args, **kwargs)

    def load(checkpoint: Mapping[str, Any], device: torch.device | str = "cpu") -> TrainedModel:
        return load_torch(name, hparams_class, build, checkpoint, device)

    def folds_per_batch(*args: Any) -> int:
        return torch_folds_per_batch(name, hparams_class, build, *args)

    return ModelSpec(
        name,
        hparams_class,
        search_space,
        train_seeds,
        load,
        neural=True,
        profile=profile,
        build_module=build,
        folds_per_batch=folds_per_batch,
    )
