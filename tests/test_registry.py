"""One registry (marketrl/settings/registry.py): every list of model names agrees with it, what tests, bench and
docs read per model comes from the model's own file (its spec's `ModelProfile`), and a model defined outside
marketrl (tests/support/throwaway_model.py), registered by ``training.extra_models``, passes the checks every
registered model gets from its profile and goes through hyperopt, training, evaluation and the report of a real
tiny pipeline run, with no other code naming it."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
import torch
import yaml

from marketrl.agents.spec import AgentSpec, ArchitectureError
from marketrl.loop.profile import models_table
from marketrl.models import MODELS, RunSettings
from marketrl.models.base import ModelSpec
from marketrl.settings.config import ConfigError, load_config, load_schema, validate_config
from marketrl.settings.registry import (
    DETERMINISTIC,
    MODEL_NAMES,
    REGISTRY,
    RegistryError,
    load_spec,
    names_under,
    registered_modules,
    spec_location,
)
from marketrl.training.zoo import ZOO, check_deterministic, get_entry
from marketrl.workflow import pipeline, stages
from tests.conftest import REPO_ROOT
from tests.support.one_seed import train_forecaster
from tests.test_models import (
    check_checkpoint_round_trip,
    check_learns_planted_signal,
    check_no_look_ahead,
    planted,
)
from tests.test_search_space_bounds import check_corners, check_pinned_ranges
from tests.test_workflow import snakemake, workdir_with_config

THROWAWAY = {"throwaway": "tests.support.throwaway_model:SPEC"}
TEST_CONFIGS = sorted((REPO_ROOT / "tests" / "configs").glob("*.yaml"))

#: Where code could name a model (the docs may cite tests/support/throwaway_model.py as the example).
CODE_SUFFIXES = (".py", ".smk", ".yaml", ".yml", ".toml", ".sh", ".cfg", ".ini")
CODE_NAMES = ("Snakefile", "Makefile")
SKIPPED_DIRS = ("__pycache__", "results", "node_modules")


def docs_models_table() -> str:
    """The generated table of docs/MODELS.md, "The models", between its markers."""
    text = (REPO_ROOT / "docs" / "MODELS.md").read_text(encoding="utf-8")
    return (
        text.split("<!-- models-table:begin")[1].split("\n", 1)[1].split("<!-- models-table:end")[0].strip()
    )


def test_every_list_of_model_names_is_the_registry() -> None:
    # the zoo and the forecasters' MODELS are built from the registry, in its order, each spec of its own name
    assert tuple(ZOO) == MODEL_NAMES == tuple(REGISTRY)
    assert all(entry.name == name for name, entry in ZOO.items())
    agents = names_under("marketrl.agents")
    assert agents == ("dqn", "ppo") and tuple(MODELS) == names_under("marketrl.models")
    assert tuple(MODEL_NAMES) == (*agents, *MODELS)  # the agents, then the forecasters
    assert all(isinstance(load_spec(REGISTRY[name]), AgentSpec) for name in agents)
    assert all(isinstance(spec, ModelSpec) for spec in MODELS.values())
    assert {name for name, entry in ZOO.items() if entry.kind == "agent"} == set(agents)
    # one spec type: every registered spec is a ModelSpec, its kind its zoo entry's
    assert all(isinstance(entry.spec, ModelSpec) and entry.spec.kind == entry.kind for entry in ZOO.values())
    # the config default is the registry, and the schema keeps no copy of the names
    assert validate_config({})["training"]["models"] == list(MODEL_NAMES)
    models_schema = load_schema()["properties"]["training"]["properties"]["models"]
    assert "default" not in models_schema and "enum" not in models_schema.get("items", {})
    raw_default = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())["training"]
    assert "models" not in raw_default  # config.yaml runs the default: every registered model
    # the test configs: the zoo run lists every model (by the default), the others registered names only
    for path in TEST_CONFIGS:
        models = load_config(path)["training"]["models"]
        assert set(models) <= set(MODEL_NAMES), path.name
    assert load_config(REPO_ROOT / "tests" / "configs" / "zoo.yaml")["training"]["models"] == list(
        MODEL_NAMES
    )
    # the docs: the forecasters' table in docs/MODELS.md, in registry order, generated from their profiles
    assert re.findall(r"^\| `([a-z0-9_]+)` \|", docs_models_table(), flags=re.MULTILINE) == list(MODELS)


def test_what_tests_bench_and_docs_read_per_model_comes_from_its_own_file() -> None:
    # every registered model's spec carries its profile: cost-driving bounds and trial cost (agents and
    # forecasters: tests/test_search_space_bounds.py, bench/speed/hyperopt_cost.py), small test sizes and its docs
    # row (forecasters: tests/test_models.py, docs/MODELS.md)
    for name, entry in ZOO.items():
        profile = entry.spec.profile
        assert profile is not None and profile.bounds and callable(profile.trial_cost), name
        if entry.kind == "forecaster":
            assert profile.small and profile.summary and profile.own_hyperparameters, name
    expected = models_table(MODELS)
    assert docs_models_table() == expected, (
        "docs/MODELS.md: the table between the models-table markers is generated from the models' profiles "
        f"(marketrl.loop.profile.models_table(MODELS)); it must read:\n{expected}"
    )


def test_the_deterministic_list_is_what_the_specs_say() -> None:
    # the workflow cannot import the specs (torch), so it reads registry.DETERMINISTIC, the lines marked
    # deterministic(...): they must match the specs (the zoo checks it when it loads, check_deterministic)
    said = [name for name, entry in ZOO.items() if getattr(entry.spec, "deterministic", False)]
    assert said == list(DETERMINISTIC) and said, said
    assert all(isinstance(REGISTRY[name], str) for name in DETERMINISTIC)  # still a plain location string
    assert load_spec(REGISTRY["linear"]).deterministic and spec_location(REGISTRY["linear"])[1] == "SPEC"
    with pytest.raises(
        RegistryError, match=r"^linear: the spec says deterministic=True but its registry line"
    ):
        check_deterministic({"linear": ZOO["linear"]}, ())
    with pytest.raises(
        RegistryError, match=r"^mlp: the spec says deterministic=False but its registry line is"
    ):
        check_deterministic({"mlp": ZOO["mlp"]}, ("mlp",))
    config = {"training": {"models": list(ZOO), "seeds": 5}}
    assert pipeline.seed_indices(config, "linear") == [0] and pipeline.seed_indices(config, "dqn") == list(
        range(5)
    )
    assert set(pipeline.stochastic_models(config)) | set(pipeline.deterministic_models(config)) == set(ZOO)


def test_registered_modules_count_in_the_code_hashes_of_the_stages_that_load_them() -> None:
    relative = {
        stage: {p.relative_to(REPO_ROOT).as_posix() for p in stages.stage_sources(stage)}
        for stage in stages.STAGES
    }
    files = {module.replace(".", "/") + ".py" for module in registered_modules()}
    for stage in ("hyperopt_worker", "hyperopt_best", "train", "evaluate"):
        assert files <= relative[stage], stage
    assert not files & relative["report"]  # names only: the report stage imports no model


def test_bad_registry_locations_fail_in_one_line() -> None:
    with pytest.raises(RegistryError, match=r"'nocolon': expected 'package.module:ATTRIBUTE'"):
        load_spec("nocolon")
    with pytest.raises(RegistryError, match=r"cannot import tests.support.nowhere"):
        load_spec("tests.support.nowhere:SPEC")
    with pytest.raises(RegistryError, match=r"tests.support.throwaway_model has no SPECS"):
        load_spec("tests.support.throwaway_model:SPECS")
    # a location that names something other than a spec, or a spec under another name
    with pytest.raises(
        RegistryError, match=r"'training.extra_models.oops': .*neither an AgentSpec nor a ModelSpec"
    ):
        get_entry("oops", {"oops": "tests.support.throwaway_model:search_space"})
    with pytest.raises(
        RegistryError, match=r"'training.extra_models.renamed': .*the spec is named 'throwaway'"
    ):
        get_entry("renamed", {"renamed": THROWAWAY["throwaway"]})
    with pytest.raises(KeyError, match=r"unknown model 'throwaway' \(known: dqn, ppo, linear"):
        get_entry("throwaway")  # not registered unless the config says so


def test_a_spec_without_its_save_load_pair_does_not_construct() -> None:
    # an agent's spec carries its checkpoint functions (set in its own file); a forecaster's its dict loader
    dqn_spec = load_spec(REGISTRY["dqn"])
    with pytest.raises(ArchitectureError, match=r"dqn: an agent's spec needs saver and loader"):
        dataclasses.replace(dqn_spec, loader=None)
    with pytest.raises(TypeError, match=r"linear: a forecaster's ModelSpec needs load"):
        dataclasses.replace(MODELS["linear"], load=None)


def test_extra_models_are_config_checked_and_reach_only_their_own_jobs() -> None:
    config = validate_config({"training": {"models": ["linear", "throwaway"], "extra_models": THROWAWAY}})
    assert get_entry("throwaway", config["training"]["extra_models"]).kind == "forecaster"
    with pytest.raises(ConfigError, match=r"^config key 'training.models': unknown model 'throwaway'; known"):
        validate_config({"training": {"models": ["throwaway"]}})
    with pytest.raises(
        ConfigError, match=r"^config key 'training.extra_models.dqn': 'dqn' is a registered model"
    ):
        validate_config({"training": {"extra_models": {"dqn": THROWAWAY["throwaway"]}}})
    with pytest.raises(
        ConfigError, match=r"^config key 'training.extra_models.throwaway': 'tests/x.py' does not"
    ):
        validate_config({"training": {"extra_models": {"throwaway": "tests/x.py"}}})
    # a model's job sees its own entry only, so registering another model changes no other job's params
    for stage in ("hyperopt_worker", "hyperopt_best", "train", "evaluate"):
        assert "extra_models" in stages.stage_config(config, stage)["training"]
        own = stages.stage_config(config, stage, model="throwaway")["training"]["extra_models"]
        assert own == THROWAWAY
        fewer = copy.deepcopy(config)
        fewer["training"]["extra_models"] = {}
        assert stages.stage_config(config, stage, model="linear") == stages.stage_config(
            fewer, stage, model="linear"
        )


# ------------------------------------------------------------------------------------------ the throwaway model


def test_the_throwaway_model_file_defines_everything_and_no_other_code_names_it(tmp_path: Path) -> None:
    spec = load_spec(THROWAWAY["throwaway"])
    profile = spec.profile
    # its bounds and trial cost: the checks every registered model gets (tests/test_search_space_bounds.py)
    check_pinned_ranges(spec, neural=spec.neural)
    check_corners(spec)
    # its small sizes: the per-model checks of tests/test_models.py
    train, test = planted(600, 0), planted(300, 1)
    settings = RunSettings(costs={"kind": "bps", "bps": 1.0}, epochs=2, check_every=10)
    model = train_forecaster(spec, train, None, settings, dict(profile.small), "fp32", "cpu", 0)
    check_learns_planted_signal(model, test)
    check_no_look_ahead(model)
    check_checkpoint_round_trip(model, test, tmp_path / "throwaway.pt", spec)
    # its docs row, rendered as docs/MODELS.md's rows are; seeds differ (its line is a plain location)
    table = models_table({**MODELS, "throwaway": spec})
    assert table.splitlines()[-1] == f"| `throwaway` | {profile.summary} | {profile.own_hyperparameters} |"
    assert not spec.deterministic and "throwaway" not in DETERMINISTIC
    # no code outside its own file and this test names it: no list of models to extend
    naming = re.compile(r"[\"'`]throwaway[\"'`]|throwaway_model")
    found = []
    for directory, subdirs, files in os.walk(REPO_ROOT):
        subdirs[:] = [d for d in subdirs if not d.startswith(".") and d not in SKIPPED_DIRS]
        for file in files:
            path = Path(directory) / file
            if path.suffix in CODE_SUFFIXES or file in CODE_NAMES:
                if naming.search(path.read_text(encoding="utf-8", errors="replace")):
                    found.append(path.relative_to(REPO_ROOT).as_posix())
    assert sorted(found) == ["tests/support/throwaway_model.py", "tests/test_registry.py"], found


@pytest.fixture(scope="module")
def throwaway_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zoo test config with only the throwaway model, registered by config (about a minute on 2 cores)."""
    config = yaml.safe_load((REPO_ROOT / "tests" / "configs" / "zoo.yaml").read_text())
    config["training"].update(models=["throwaway"], extra_models=THROWAWAY)
    workdir = workdir_with_config(tmp_path_factory.mktemp("throwaway_run"), config)
    result = snakemake("--cores", "2", cwd=workdir, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return workdir


@pytest.mark.slow
def test_a_model_from_tests_goes_through_hyperopt_train_evaluate_and_report(throwaway_run: Path) -> None:
    config = load_config(throwaway_run / "config.yaml")
    study = json.loads((throwaway_run / "results" / "hyperopt" / "throwaway.json").read_text())
    assert study["algo"] == "throwaway" and study["kind"] == "forecaster"
    assert study["best_params"]["hidden_dim_base"] == 4 and study["n_trials"] == 1
    assert pipeline.model_files(config) == ["results/models/throwaway/fold_0/seed_0/model.pt"]
    checkpoint = torch.load(throwaway_run / pipeline.model_files(config)[0], weights_only=True)
    assert checkpoint["format"] == "marketrl-model" and checkpoint["model"] == "throwaway"
    weights = {key for key in checkpoint["state"]["state_dict"] if key.startswith("module.")}
    assert weights == {"module.head.weight", "module.head.bias"}  # the one linear layer
    metrics = json.loads((throwaway_run / pipeline.eval_files(config)[0]).read_text())
    assert metrics["algo"] == "throwaway" and metrics["kind"] == "forecaster" and metrics["horizon"] == 1
    html = (throwaway_run / "results" / "eval_report.html").read_text(encoding="utf-8")
    assert "<strong>throwaway</strong>" in html  # its leaderboard row
    assert "results/eval/throwaway/fold_0/seed_0/metrics.json" in html  # read by the report
