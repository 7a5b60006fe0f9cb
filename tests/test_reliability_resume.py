"""Resumable training and hyperopt: a run killed mid-way ends exactly where an uninterrupted one does.

Library level (seconds): DQN and PPO stopped after a checkpoint and resumed give bit-identical weights, history and
evaluations; a checkpoint of another run is not resumed; a NaN mid-training stops the run naming the step window
and keeps the last good checkpoint; an Optuna worker killed with SIGKILL mid-trial leaves a study that the next
worker completes with the trials it already had, ending with the same values as an uninterrupted study.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from gpu_utils import DeviceMetrics, NonFiniteError, OptimStep, resolve_precision
from marketrl.agents import dqn, ppo
from marketrl.env import EnvConfig
from marketrl.loop.resume import TrainingCheckpoint, resume_or_start
from marketrl.loop.schedule import EvalSchedule, seeded
from marketrl.training.hyperopt import INTERRUPTED, SLOT
from tests.conftest import REPO_ROOT
from tests.faults import optuna_worker
from tests.support.one_seed import train_agent
from tests.test_agents import planted_data

ENV = EnvConfig(n_envs=8, episode_length=64, max_gap=None)
SEED = 5
RUNS = {
    # algo: (trainer, config, hparams); DQN: 1600 env steps = 200 vector steps, PPO: 10 updates of 128 steps
    "dqn": (
        dqn,
        dqn.DQNConfig(total_steps=1600, env=ENV, eval_every=160, check_every=10),
        {"learning_starts": 80, "buffer_size": 4000, "batch_size": 32, "target_update": 40},
    ),
    "ppo": (
        ppo,
        ppo.PPOConfig(total_steps=1280, env=ENV, eval_every=128),
        {"n_steps": 16, "batch_size": 64, "n_epochs": 2},
    ),
}
FINGERPRINT = {"run": "test", "seed": SEED}


class Killed(Exception):
    """Stands in for the job dying (the pipeline tests use a real SIGKILL)."""


@pytest.fixture(scope="module")
def data():
    return planted_data(1200)[0]


def train(data, algo: str, checkpoint: TrainingCheckpoint | None = None, kill_at: int | None = None):
    trainer, config, hparams = RUNS[algo]

    def on_eval(step: int, policy) -> float:
        if kill_at is not None and step >= kill_at:
            raise Killed(step)
        return float(step)  # the schedule records it; training never depends on it

    return train_agent(
        trainer, data, config, hparams, "fp32", "cpu", SEED, on_eval=on_eval, checkpoint=checkpoint
    )


def weights(result) -> dict[str, dict[str, torch.Tensor]]:
    return {name: net.state_dict() for name, net in result.networks.items()}


def assert_same_weights(left, right) -> None:
    for name, state in weights(left).items():
        other = weights(right)[name]
        assert state.keys() == other.keys()
        for key in state:
            assert torch.equal(state[key], other[key]), f"{name}.{key} differs"


@pytest.fixture(scope="module")
def uninterrupted(data):
    return {algo: train(data, algo) for algo in RUNS}


@pytest.mark.parametrize("algo", list(RUNS))
def test_killed_and_resumed_run_matches_uninterrupted(data, uninterrupted, tmp_path: Path, algo: str) -> None:
    path = tmp_path / "resume.pt"
    with pytest.raises(Killed):
        train(data, algo, TrainingCheckpoint(path, 400, FINGERPRINT), kill_at=700)
    saved = torch.load(path, weights_only=True)  # plain data only
    assert 400 <= saved["step"] < 700

    checkpoint = TrainingCheckpoint(path, 400, FINGERPRINT)
    resumed = train(data, algo, checkpoint)
    assert checkpoint.resumed_from == saved["step"]
    assert checkpoint.saves >= 1  # it kept checkpointing after the resume
    reference = uninterrupted[algo]
    assert_same_weights(resumed, reference)
    assert resumed.log["history"] == reference.log["history"]
    assert resumed.log["evals"] == reference.log["evals"]  # evaluations before the kill were kept
    assert resumed.log["host_syncs"] == reference.log["host_syncs"]
    assert resumed.log["env_steps"] == reference.log["env_steps"]


@dataclass
class SupervisedLoop:
    step: int = 0


def fit_regression(checkpoint: TrainingCheckpoint | None, kill_at: int | None = None):
    """A supervised loop on the shared hooks: the same calls the agents make, no environment anywhere."""
    device = torch.device("cpu")
    plan = resolve_precision("fp32", device)
    with seeded(0):
        model = torch.nn.Linear(4, 1)
    stepper = OptimStep.adam(model.parameters(), 1e-2, plan, max_grad_norm=1.0)
    metrics = DeviceMetrics(["loss", "grad_norm"], device, watched=("loss",), capacity=10)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.linspace(-1, 1, 256 * 4).reshape(256, 4)
    targets = inputs @ torch.tensor([0.5, -1.0, 2.0, 0.0]) + 0.1

    def validate(step: int, net) -> float:
        if kill_at is not None and step >= kill_at:
            raise Killed(step)
        return float(step)

    evals = EvalSchedule(validate, 20)
    state = SupervisedLoop()
    components = {
        "model": model,
        "optim": stepper,
        "metrics": metrics,
        "evals": evals,
        "generator": generator,
    }
    run = resume_or_start(checkpoint, components, state, total_steps=100, device=device)
    for step in range(state.step, 100):
        index = torch.randint(0, 256, (32,), generator=generator)
        with plan.autocast():
            prediction = model(inputs[index])
        loss = torch.nn.functional.mse_loss(prediction.float().squeeze(1), targets[index])
        metrics.record([loss.detach(), stepper.step(loss)])
        state.step = step + 1
        if state.step % 10 == 0:
            run.log({"step": state.step, **metrics.read(state.step)})
        evals.maybe(state.step, model)
        run.maybe_save(state.step)
    return model.state_dict(), run.finish(state.step)["history"], evals.records


def test_supervised_loop_resumes_through_the_same_hooks(tmp_path: Path) -> None:
    reference = fit_regression(None)
    path = tmp_path / "resume.pt"
    with pytest.raises(Killed):
        fit_regression(TrainingCheckpoint(path, 30, FINGERPRINT), kill_at=70)
    checkpoint = TrainingCheckpoint(path, 30, FINGERPRINT)
    weights_after, history, evals = fit_regression(checkpoint)
    assert checkpoint.resumed_from == 60
    assert all(torch.equal(weights_after[key], reference[0][key]) for key in reference[0])
    assert history == reference[1] and len(history) == 10
    assert evals == reference[2] == [[step, float(step)] for step in (20, 40, 60, 80, 100)]
    assert history[-1]["loss"] < history[0]["loss"]  # it did learn


def test_checkpointing_does_not_change_training(data, uninterrupted, tmp_path: Path) -> None:
    checkpoint = TrainingCheckpoint(tmp_path / "resume.pt", 160, FINGERPRINT)
    result = train(data, "dqn", checkpoint)
    assert checkpoint.saves == 9 and checkpoint.resumed_from is None  # 160, 320, ..., 1440 (not at the end)
    assert_same_weights(result, uninterrupted["dqn"])


def test_checkpoint_of_another_run_is_not_resumed(data, uninterrupted, tmp_path: Path) -> None:
    path = tmp_path / "resume.pt"
    with pytest.raises(Killed):
        train(data, "ppo", TrainingCheckpoint(path, 256, {**FINGERPRINT, "hparams": "old"}), kill_at=700)
    assert path.exists()
    checkpoint = TrainingCheckpoint(path, 256, FINGERPRINT)
    result = train(data, "ppo", checkpoint)
    assert checkpoint.resumed_from is None  # trained from scratch, and still the reference result
    assert_same_weights(result, uninterrupted["ppo"])


def test_damaged_checkpoint_trains_from_scratch(data, uninterrupted, tmp_path: Path) -> None:
    path = tmp_path / "resume.pt"
    path.write_bytes(b"not a checkpoint")
    checkpoint = TrainingCheckpoint(path, 0, FINGERPRINT)
    assert_same_weights(train(data, "ppo", checkpoint), uninterrupted["ppo"])
    assert checkpoint.resumed_from is None


@pytest.mark.parametrize(
    ("algo", "poisoned", "first_bad"), [("dqn", "td_loss_all_actions", 130), ("ppo", "ppo_loss", 25)]
)
def test_nan_mid_training_stops_in_window_and_keeps_last_good_checkpoint(
    data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algo: str, poisoned: str, first_bad: int
) -> None:
    """From gradient step `first_bad` on, the loss is NaN; the guard must stop the run within its check window."""
    trainer = RUNS[algo][0]
    real_loss = getattr(trainer, poisoned)
    calls = 0

    def nan_loss(*args, **kwargs):
        nonlocal calls
        calls += 1
        loss, extra = real_loss(*args, **kwargs)
        return (loss * float("nan") if calls >= first_bad else loss), extra

    monkeypatch.setattr(trainer, poisoned, nan_loss)
    path = tmp_path / "resume.pt"
    with pytest.raises(NonFiniteError) as info:
        train(data, algo, TrainingCheckpoint(path, 240, FINGERPRINT))
    message = str(info.value)
    assert "\n" not in message
    first, last = (int(x) for x in message.split("between steps ")[1].split(" and "))
    window = RUNS[algo][1].check_every if algo == "dqn" else 2 * 16 * 8 // 64  # PPO: one update's minibatches
    assert first <= first_bad <= last and last - first + 1 <= window  # caught within one check window
    saved = torch.load(path, weights_only=True)
    state = saved["state"]
    assert state["grad_steps"] < first_bad  # the file on disk predates the NaN ...
    networks = ("q", "target") if algo == "dqn" else ("policy", "value")
    for name in networks:  # ... and holds finite weights
        assert all(torch.isfinite(t).all() for t in state[name].values())


# -------------------------------------------------------------------------------- Optuna: a real killed worker


def _worker(results: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.faults.optuna_worker", str(results), mode],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        start_new_session=True,
    )


@pytest.mark.parametrize("mode", ["hold", "hold_partial"])
def test_killed_optuna_worker_resumes_with_its_trials(tmp_path: Path, mode: str) -> None:
    """Killed after drawing all of trial 2's parameters (rerun with them) or only some (drawn again, the same)."""
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    optuna_worker.main(reference_dir)  # the study that was never interrupted

    victim = _worker(killed_dir, mode)
    deadline = time.monotonic() + 120
    while not (killed_dir / "in_trial_2").exists():
        assert victim.poll() is None and time.monotonic() < deadline, "worker never reached trial 2"
        time.sleep(0.02)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    before = [(t.number, t.state.name, t.value) for t in optuna_worker.study(killed_dir).trials]
    assert [state for _, state, _ in before] == ["COMPLETE", "COMPLETE", "RUNNING"]

    assert _worker(killed_dir, "run").wait(120) == 0
    trials = optuna_worker.study(killed_dir).trials
    assert [(t.number, t.state.name, t.value) for t in trials[:2]] == before[:2]  # kept, not rerun
    assert trials[2].state.name == "FAIL" and trials[2].user_attrs[INTERRUPTED] is True
    rerun = trials[3]
    assert rerun.user_attrs[SLOT] == trials[2].user_attrs[SLOT] == 2
    assert trials[2].params.items() <= rerun.params.items()  # what was drawn before the kill is kept
    counted = [t for t in trials if not t.user_attrs.get(INTERRUPTED)]
    reference = optuna_worker.study(reference_dir).trials
    # Same slots, same parameters, same values as the study that was never interrupted.
    assert [(t.user_attrs[SLOT], t.params, t.value) for t in counted] == [
        (t.user_attrs[SLOT], t.params, t.value) for t in reference
    ]
    assert len(counted) == 4 and all(t.state.name == "COMPLETE" for t in counted)
    json.dumps([t.params for t in counted])  # plain data


def test_interrupted_last_slot_is_rerun_not_dropped(tmp_path: Path) -> None:
    """Regression: the re-enqueued (WAITING) trial of the last slot used to count as done and never ran."""
    from marketrl.training.hyperopt import claim_trial, recover_interrupted, study_lock

    study = optuna_worker.study(tmp_path)
    for _ in range(3):
        trial = claim_trial(study, 4, seed=17)
        study.tell(trial, trial.suggest_float("x", -2.0, 2.0))
    orphan = claim_trial(study, 4, seed=17)
    orphan.suggest_float("x", -2.0, 2.0)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    orphan.set_user_attr("owner", f"{__import__('socket').gethostname()}:{dead.stdout.strip()}")
    with study_lock("dqn", tmp_path):
        assert recover_interrupted(study) == 1
    rerun = claim_trial(study, 4, seed=17)
    assert rerun is not None and rerun.user_attrs[SLOT] == 3
    assert rerun.suggest_float("x", -2.0, 2.0) == study.trials[3].params["x"]  # the orphan's parameters


def test_worker_killed_while_writing_the_journal_leaves_no_stale_lock(tmp_path: Path) -> None:
    """A SIGKILL while holding the journal's write lock must not block the next worker.

    Optuna's default symlink lock stayed behind and (with the relative journal path) made the resumed worker wait
    forever; the flock lock dies with its holder.
    """
    lock = tmp_path / "hyperopt" / "dqn" / "journal.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from marketrl.training.hyperopt import JournalFlock; "
            "lock = JournalFlock(sys.argv[1]); lock.acquire(); open(sys.argv[2], 'w').close(); time.sleep(600)",
            str(lock),
            str(tmp_path / "locked"),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "locked").exists():
        assert holder.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    with open(lock) as handle:  # held by the live process: a non-blocking attempt fails
        with pytest.raises(BlockingIOError):
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    with open(lock) as handle:  # the kill released it at once
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    assert sorted(p.name for p in lock.parent.iterdir()) == ["journal.lock"]  # no symlink lock left
    optuna_worker.main(tmp_path)
    assert len(optuna_worker.study(tmp_path).trials) == optuna_worker.N_TRIALS


def test_checkpoint_with_non_finite_weights_is_not_written(tmp_path: Path) -> None:
    net = torch.nn.Linear(3, 2)
    checkpoint = TrainingCheckpoint(tmp_path / "resume.pt", 100, FINGERPRINT)
    checkpoint.save(100, {"weights": net.state_dict()}, [net])
    good = (tmp_path / "resume.pt").read_bytes()
    with torch.no_grad():
        net.weight[0, 1] = float("inf")
    with pytest.raises(NonFiniteError, match="at step 200; last good checkpoint kept"):
        checkpoint.save(200, {"weights": net.state_dict()}, [net])
    assert (tmp_path / "resume.pt").read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["resume.pt"]
    assert TrainingCheckpoint(tmp_path / "resume.pt", 100, FINGERPRINT).load()["weights"]["bias"].shape == (
        2,
    )
