"""Hyperopt study mechanics: exact trial counts across workers, resume after a kill, pruning, the summary JSON."""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from gpu_utils import NonFiniteError
from marketrl.agents import dqn, ppo
from marketrl.settings.config import ConfigError, validate_config
from marketrl.splits.folds import FoldConfig, make_fold_plan
from marketrl.training.hyperopt import (
    INTERRUPTED,
    OWNER,
    HyperoptError,
    check_fixed,
    claim_trial,
    counted_trials,
    load_study,
    work_on_study,
    write_study_summary,
)
from marketrl.training.train import HparamsError, load_hparams
from marketrl.workflow.stages import stage_config


def make_config(n_trials: int = 6, workers: int = 1) -> dict:
    return validate_config({"hyperopt": {"n_trials": n_trials, "workers": workers}, "seed": 5})


def write_fold_plan(path: Path) -> Path:
    """A small fold plan: the study summary records its tuning window."""
    cfg = FoldConfig(
        n=1,
        scheme="expanding",
        train_days=4,
        validation_days=1,
        test_days=1,
        tuning_days=4,
        tuning_validation_days=1,
        embargo_bars=30,
    )
    days = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(cfg.required_days)]
    make_fold_plan(days, cfg).save(path)
    return path


def quadratic(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -2.0, 2.0)
    trial.set_user_attr("val_sharpe_daily", -(x**2) / 16.0)
    return -(x**2)


def _worker(results_dir: str, worker: int, n_trials: int, out: str) -> None:
    study = load_study(make_config(n_trials, 2), "dqn", worker, results_dir)
    ran = work_on_study(study, "dqn", n_trials, quadratic, results_dir)
    Path(out).write_text(json.dumps(ran))


def test_two_parallel_workers_run_exactly_n_trials(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    outs = [tmp_path / f"w{i}.json" for i in range(2)]
    procs = [context.Process(target=_worker, args=(str(tmp_path), i, 9, str(outs[i]))) for i in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    ran = [json.loads(out.read_text()) for out in outs]
    assert sorted(ran[0] + ran[1]) == list(range(9))  # every trial run once, none twice, none extra
    study = load_study(make_config(9, 2), "dqn", 0, tmp_path)
    assert len(study.trials) == 9


def test_interrupted_study_resumes_with_its_trials(tmp_path: Path) -> None:
    config = make_config(n_trials=4)
    study = load_study(config, "dqn", 0, tmp_path)
    work_on_study(study, "dqn", 2, quadratic, tmp_path)  # two finished trials survive the "crash"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    orphan = study.ask()
    orphan.suggest_float("x", -2.0, 2.0)
    orphan.set_user_attr(OWNER, f"{__import__('socket').gethostname()}:{dead.stdout.strip()}")
    orphan_params = study.trials[-1].params
    # A new worker process picks the study up: the orphan is marked interrupted and its params run again.
    resumed = load_study(config, "dqn", 0, tmp_path)
    ran = work_on_study(resumed, "dqn", 4, quadratic, tmp_path)
    trials = load_study(config, "dqn", 0, tmp_path).trials
    assert [t.state.name for t in trials[:2]] == ["COMPLETE", "COMPLETE"]
    assert trials[2].user_attrs.get(INTERRUPTED) is True
    assert len(counted_trials(resumed)) == 4 and len(ran) == 2
    assert trials[3].params == orphan_params  # re-enqueued, not lost


def test_a_claim_killed_before_its_owner_was_recorded_is_recovered(tmp_path: Path) -> None:
    # A worker killed between ask() and recording its owner leaves an ownerless RUNNING trial; under the claim
    # lock no live claimer can be in that state, so the next worker re-runs the slot instead of counting it.
    config = make_config(n_trials=3)
    study = load_study(config, "dqn", 0, tmp_path)
    study.ask()  # the claim that died half-way: no slot, no owner
    ran = work_on_study(load_study(config, "dqn", 1, tmp_path), "dqn", 3, quadratic, tmp_path)
    trials = load_study(config, "dqn", 0, tmp_path).trials
    assert trials[0].user_attrs.get(INTERRUPTED) is True and trials[0].state.name == "FAIL"
    assert len(ran) == 3 and len(counted_trials(study)) == 3
    assert all(t.state.name == "COMPLETE" for t in trials[1:])


def test_live_workers_trials_are_not_stolen(tmp_path: Path) -> None:
    study = load_study(make_config(), "dqn", 0, tmp_path)
    trial = claim_trial(study, 6)  # owned by this (alive) process
    assert trial is not None
    resumed = load_study(make_config(), "dqn", 1, tmp_path)
    ran = work_on_study(resumed, "dqn", 3, quadratic, tmp_path)
    assert len(ran) == 2  # the running trial counts towards n_trials and stays RUNNING
    assert resumed.trials[0].state == optuna.trial.TrialState.RUNNING


def test_non_finite_trial_is_pruned_not_crashed(tmp_path: Path) -> None:
    study = load_study(make_config(), "dqn", 0, tmp_path)
    calls = iter([NonFiniteError("non-finite 'loss' between steps 101 and 200"), None, None])

    def objective(trial: optuna.Trial) -> float:
        error = next(calls)
        if error is not None:
            raise error
        return quadratic(trial)

    ran = work_on_study(study, "dqn", 3, objective, tmp_path)
    assert len(ran) == 3
    first = study.trials[0]
    assert first.state == optuna.trial.TrialState.PRUNED
    assert "steps 101 and 200" in first.user_attrs["pruned_reason"]


def test_other_errors_fail_the_trial_and_propagate(tmp_path: Path) -> None:
    study = load_study(make_config(), "dqn", 0, tmp_path)

    def broken(trial: optuna.Trial) -> float:
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError, match="bug"):
        work_on_study(study, "dqn", 3, broken, tmp_path)
    assert study.trials[0].state == optuna.trial.TrialState.FAIL


def test_search_spaces_always_tune_hidden_dim_base_and_never_costs() -> None:
    for suggest, reward_scale in ((dqn.search_space, 1.0), (ppo.search_space, 100.0)):
        trial = optuna.trial.FixedTrial(
            {
                "hidden_dim_base": 256,
                "learning_rate": 1e-4,
                "gamma": 0.99,
                "batch_size": 256,
                "exploration_fraction": 0.1,
                "exploration_final_eps": 0.05,
                "target_update": 500,
                "gradient_steps": 1,
                "gae_lambda": 0.95,
                "n_steps": 64,
                "n_epochs": 4,
                "clip_range": 0.2,
                "ent_coef": 0.01,
                "reward_scale": reward_scale,  # DQN: a multiplier of its normalized rewards
            }
        )
        params = suggest(trial, (64, 4096))
        assert params["hidden_dim_base"] == 256
        assert not any("cost" in key or "commission" in key or "spread" in key for key in params)


def test_batch_choices_respect_hardware_bounds() -> None:
    seen = set()
    for number in range(30):
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=number))
        seen.add(dqn.search_space(study.ask(), (64, 128))["batch_size"])
    assert seen <= {64, 128}


def summarize_dqn_study(tmp_path: Path, config: dict) -> dict:
    """write_study_summary of the dqn study under tmp_path/results, its five trials run by one worker."""
    worker = tmp_path / "results/hyperopt/dqn/worker_0.json"
    worker.write_text(json.dumps({"trials_run": list(range(5)), "precision": {"mode": "fp32"}}))
    return write_study_summary(
        model="dqn",
        worker_summaries=[str(worker)],
        folds_path=write_fold_plan(tmp_path / "folds.json"),
        config=config,
        out_path=str(tmp_path / "results/hyperopt/dqn.json"),
        results_dir=tmp_path / "results",
    )


def test_summary_json_carries_best_params_and_every_trial(tmp_path: Path) -> None:
    config = make_config(n_trials=5)
    study = load_study(config, "dqn", 0, tmp_path / "results")
    work_on_study(study, "dqn", 5, quadratic, tmp_path / "results")
    summary = summarize_dqn_study(tmp_path, config)
    assert summary["tuning_window"]["first_day"] == "2024-01-01"
    assert summary["n_trials"] == 5 == len(summary["trials"]) == len(summary["trial_sharpe_daily"])
    assert summary["best_value"] == max(t["value"] for t in summary["trials"])
    assert load_hparams(tmp_path / "results/hyperopt/dqn.json", "dqn") == summary["best_params"]


def test_summary_refuses_a_short_study(tmp_path: Path) -> None:
    config = make_config(n_trials=5)
    study = load_study(config, "dqn", 0, tmp_path / "results")
    work_on_study(study, "dqn", 3, quadratic, tmp_path / "results")
    with pytest.raises(HyperoptError, match="holds 3 trials"):
        write_study_summary(
            model="dqn",
            worker_summaries=[],
            folds_path=write_fold_plan(tmp_path / "folds.json"),
            config=config,
            out_path=str(tmp_path / "results/hyperopt/dqn.json"),
            results_dir=tmp_path / "results",
        )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot read hyperparameters"),
        ('{"algo": "dqn"}', "best_params"),
        ('{"algo": "dqn", "best_params": {"learning_rate": [1]}}', "best_params.learning_rate"),
        ('{"algo": "ppo", "best_params": {}}', "not 'dqn'"),
    ],
)
def test_bad_hyperparameter_files_name_the_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "dqn.json"
    path.write_text(content)
    with pytest.raises(HparamsError, match=message) as excinfo:
        load_hparams(path, "dqn")
    assert str(path) in str(excinfo.value)


def test_storage_url_from_the_environment_wins_and_outputs_never_carry_the_password(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from marketrl.runtime.provenance import collect, redact_url
    from marketrl.training.study_storage import STORAGE_ENV, storage_label, storage_url

    config = make_config()
    assert storage_url(config) == "" and storage_label(config, "dqn", tmp_path).endswith("dqn/journal.log")
    config["hyperopt"]["storage"] = "postgresql://ana:s3cret@db:5432/optuna?sslmode=require"
    assert storage_url(config) == config["hyperopt"]["storage"]
    assert storage_label(config, "dqn") == "postgresql://ana@db:5432/optuna?sslmode=require"
    monkeypatch.setenv(STORAGE_ENV, "postgresql://bob:pw2@other/optuna?password=pw3")
    assert storage_url(config) == "postgresql://bob:pw2@other/optuna?password=pw3"
    assert redact_url(storage_url(config)) == "postgresql://bob@other/optuna"
    record = json.dumps(collect(config))
    assert "s3cret" not in record and "postgresql://ana@db:5432/optuna?sslmode=require" in record
    assert config["hyperopt"]["storage"].endswith(
        "s3cret@db:5432/optuna?sslmode=require"
    )  # caller's copy kept


def test_heartbeat_grace_must_exceed_the_heartbeat() -> None:
    from marketrl.settings.config import ConfigError

    with pytest.raises(ConfigError, match=r"hyperopt\.grace_seconds"):
        validate_config({"hyperopt": {"heartbeat_seconds": 30, "grace_seconds": 30}})


def test_postgres_url_without_the_driver_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg2", None)  # as if psycopg2-binary were not installed
    config = make_config()
    config["hyperopt"]["storage"] = "postgresql://ana:s3cret@db.invalid:5432/optuna"
    with pytest.raises(HyperoptError) as excinfo:
        load_study(config, "dqn")
    message = str(excinfo.value)
    assert message.startswith("config key 'hyperopt.storage': postgresql://ana@db.invalid:5432/optuna needs")
    assert "'.[postgres]'" in message and "s3cret" not in message and "\n" not in message


def two_params(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -2.0, 2.0)
    width = trial.suggest_categorical("width", [16, 32, 64])
    trial.set_user_attr("val_sharpe_daily", -(x**2) / 16.0)
    return -(x**2) + width / 1000.0


def test_fixed_parameters_are_pinned_in_every_trial_and_the_summary(tmp_path: Path) -> None:
    """hyperopt.fixed pins a parameter in every trial (also after the per-slot reseeding), the others are still
    searched, and the summary's best parameters and `fixed_params` carry it."""
    config = validate_config({"hyperopt": {"n_trials": 5, "fixed": {"dqn": {"width": 32}}}, "seed": 5})
    study = load_study(config, "dqn", 0, tmp_path / "results")
    work_on_study(study, "dqn", 5, two_params, tmp_path / "results", seed=11, fixed={"width": 32})
    assert [t.params["width"] for t in study.trials] == [32] * 5
    assert len({t.params["x"] for t in study.trials}) == 5  # x still searched
    free = load_study(make_config(n_trials=5), "dqn", 0, tmp_path / "free")
    work_on_study(free, "dqn", 5, two_params, tmp_path / "free", seed=11)
    # without the pin the same slots draw other widths
    assert {t.params["width"] for t in free.trials} != {32}
    summary = summarize_dqn_study(tmp_path, config)
    assert summary["best_params"]["width"] == 32 and summary["fixed_params"] == {"width": 32}


@pytest.mark.parametrize(
    ("fixed", "message"),
    [
        ({"hidden": 64}, "'hyperopt.fixed.dqn.hidden': not a parameter of dqn's search"),
        (
            {"hidden_dim_base": 512},
            "'hyperopt.fixed.dqn.hidden_dim_base': 512 is outside dqn's search (one of 64",
        ),
        (
            {"learning_rate": 0.01},
            "'hyperopt.fixed.dqn.learning_rate': 0.01 is outside dqn's search (1e-05 … 0.0001)",
        ),
        ({"gradient_steps": True}, "'hyperopt.fixed.dqn.gradient_steps': True is outside"),
    ],
)
def test_fixed_parameters_outside_the_search_are_config_errors(fixed: dict, message: str) -> None:
    """A pinned name the model does not search, or a value outside its range or choices, is one line naming the
    key; values inside pass (4 among gradient_steps' choices, a float inside the learning-rate range)."""
    space = lambda trial: dqn.search_space(trial, (64, 512))  # noqa: E731
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_fixed(space, fixed, "dqn")
    check_fixed(space, {"gradient_steps": 4, "learning_rate": 3e-5, "reward_scale": 1.0}, "dqn")


def test_fixed_parameters_of_an_unknown_model_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match=re.escape("'hyperopt.fixed.dqm': unknown model 'dqm'")):
        validate_config({"hyperopt": {"fixed": {"dqm": {"gamma": 0.8}}}})


def test_a_models_fixed_parameters_are_in_its_own_jobs_params_only() -> None:
    """Pinning DQN's parameters changes DQN's hyperopt jobs' params (so they rerun) and no other model's."""
    base = validate_config({})
    pinned = validate_config({"hyperopt": {"fixed": {"dqn": {"gradient_steps": 4}}}})
    for stage in ("hyperopt_worker", "hyperopt_best"):
        assert stage_config(base, stage, model="ppo") == stage_config(pinned, stage, model="ppo")
        assert stage_config(base, stage, model="dqn") != stage_config(pinned, stage, model="dqn")
        assert stage_config(pinned, stage, model="dqn")["hyperopt"]["fixed"] == {"dqn": {"gradient_steps": 4}}
