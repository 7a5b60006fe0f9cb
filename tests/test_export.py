"""Export round trip: every model kind is trained and evaluated by the pipeline's own jobs on a tiny feature table,
exported by the export job, then loaded in a fresh process that imports no marketrl (torch, onnxruntime,
lightgbm, numpy only); on the same raw feature rows of the test split it must give the evaluation's positions,
bit for bit, and its predictions to float tolerance. The README's example runs on one of the exports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from marketrl.evaluation.evaluate import evaluate_job
from marketrl.models import MODELS
from marketrl.settings.config import load_config
from marketrl.settings.registry import DETERMINISTIC
from marketrl.splits.datasets import fold_window, load_features
from marketrl.splits.folds import FoldPlan
from marketrl.training.export import export_job, read_export
from marketrl.training.train import train_job
from marketrl.training.zoo import ZOO
from marketrl.workflow import pipeline
from tests.faults.pipeline import copy_of_shared_run
from tests.support.runs import TINY_DQN_HPARAMS, synthetic_job_inputs
from tests.test_workflow import job_counts, snakemake

REPO_ROOT = Path(__file__).resolve().parents[1]
SEQUENCE = {"window": 3, "hidden_dim_base": 8, "batch_size": 32, "learning_rate": 1e-2}
HPARAMS = {
    "dqn": TINY_DQN_HPARAMS,
    "ppo": {"n_steps": 16, "batch_size": 32, "n_epochs": 1, "hidden_dim_base": 8},
    "linear": {"window": 3, "alpha": 0.1},
    "lightgbm": {"window": 2, "n_estimators": 20, "min_data_in_leaf": 5, "num_leaves": 4},
    **{name: dict(SEQUENCE) for name, spec in MODELS.items() if spec.neural},
}
# every threshold low enough that the trading rule trades on the random test rows
RULE = {"threshold_multiplier": 0.01, "hold_band": 0.5}

# The fresh process: numpy, torch, onnxruntime, lightgbm; the positions every export gives on the raw rows.
REFERENCE = r"""
import json, sys
import numpy as np, torch, onnxruntime, lightgbm

def normalize(raw, n):
    z = (raw.astype(np.float32) - np.asarray(n["mean"], np.float32)) / np.asarray(n["std"], np.float32)
    z[np.isnan(z)] = 0.0
    return np.clip(z, -n["clip"], n["clip"]).astype(np.float32)

def window_at(x, t, w, first):  # rows t-w+1..t, oldest first; rows before the segment's first repeat it
    return x[np.maximum(np.arange(t - w + 1, t + 1), first)]

def agent_positions(act, meta, x, seg, chain):
    held, out = 0.0, np.zeros(len(x), np.float32)
    for t in range(len(x)):
        held = 0.0 if t == chain[t] else held
        windows = window_at(x, t, meta["window"], seg[t])[None]
        held = out[t] = float(act(windows, np.array([held], np.float32))[0])
    return out

def forecaster_positions(predict, meta, x, close, seg, chain):
    w, rule, cost = meta["window"], meta["trading_rule"], meta["trading_rule"]["round_trip_cost"]
    rows = np.array([t for t in range(len(x)) if t - w + 1 >= seg[t]], dtype=np.int64)
    pred = np.zeros(len(x), np.float32)
    pred[rows] = predict(np.stack([x[t - w + 1 : t + 1] for t in rows]))
    side = cost["cost_per_contract"] / (close * cost["point_value"]) if cost["kind"] == "futures" else cost["fraction_per_side"] + 0 * close
    threshold = np.float32(rule["threshold_multiplier"]) * (np.float32(2.0) * side.astype(np.float32))
    held, out = 0.0, np.zeros(len(x), np.float32)
    for t in range(len(x)):
        held = 0.0 if t == chain[t] else held
        p, d = abs(pred[t]), float(np.sign(pred[t]))
        keep = p > np.float32(rule["hold_band"]) * threshold[t] and d != 0 and held == d
        held = out[t] = d if p > threshold[t] or keep else 0.0
    return out, pred

rows = np.load(sys.argv[1])
x_raw, close, seg, chain = rows["raw"], rows["close"], rows["segment_start"], rows["chain_start"]
results = {}
for directory in sys.argv[3:]:
    meta = json.load(open(f"{directory}/export.json"))
    x = normalize(x_raw, meta["normalizer"])
    backends = {}
    if meta["files"]["torchscript"]:
        module = torch.jit.load(f"{directory}/{meta['files']['torchscript']}")
        backends["torchscript"] = lambda *a, m=module: m(*map(torch.from_numpy, a)).numpy()
    if meta["files"]["onnx"]:
        session = onnxruntime.InferenceSession(f"{directory}/{meta['files']['onnx']}")
        names = [i.name for i in session.get_inputs()]
        backends["onnx"] = lambda *a, s=session, n=names: s.run(None, dict(zip(n, a)))[0]
    if meta["files"]["lightgbm"]:
        booster = lightgbm.Booster(model_file=f"{directory}/{meta['files']['lightgbm']}")
        backends["lightgbm"] = lambda a, b=booster: b.predict(a.reshape(len(a), -1)).astype(np.float32)
    for backend, run in backends.items():
        if meta["kind"] == "agent":
            results[f"{directory}|{backend}|positions"] = agent_positions(run, meta, x, seg, chain)
        else:
            positions, pred = forecaster_positions(run, meta, x, close, seg, chain)
            results[f"{directory}|{backend}|positions"] = positions
            results[f"{directory}|{backend}|predictions"] = pred
assert not any(name == "marketrl" or name.startswith("marketrl.") for name in sys.modules), "marketrl imported"
np.savez(sys.argv[2], **results)
"""


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny feature table, its fold plan and a config with tiny budgets (as tests/test_zoo.py)."""
    root = tmp_path_factory.mktemp("export")
    _, manifest, folds, config = synthetic_job_inputs(root, n_instruments=2)
    config["env"].update(window=2, episode_length=16)
    config["training"].update(
        total_steps=256,
        n_envs=4,
        checkpoint_every=10_000,
        horizon=2,
        max_updates=20,
        check_every=5,
        # the export must reproduce what each model learned: tiny runs would mostly be set flat by the gate
        # (its record in export.json is checked by test_a_gated_run_exports_its_gate)
        gate_min_t=None,
    )
    return {"root": root, "config": config, "manifest_path": str(manifest), "folds_path": str(folds)}


def run_model(inputs: dict, model: str) -> dict:
    """Train, evaluate and export `model` on fold 0 (two seeds, one for a deterministic model)."""
    out = inputs["root"] / model
    out.mkdir()
    hparams = out / "hparams.json"
    best = {**HPARAMS[model], **(RULE if ZOO[model].kind == "forecaster" else {})}
    hparams.write_text(json.dumps({"algo": model, "best_params": best}), encoding="utf-8")
    seeds = [0] if model in DETERMINISTIC else [0, 1]
    models = [str(out / f"seed_{s}" / "model.pt") for s in seeds]
    common = {"manifest_path": inputs["manifest_path"], "folds_path": inputs["folds_path"]}
    train_job(
        model=model,
        fold=0,
        seed_indices=seeds,
        hparams_path=str(hparams),
        config=inputs["config"],
        model_paths=models,
        log_paths=[str(out / f"seed_{s}" / "train_log.json") for s in seeds],
        resume_path=str(out / "resume.pt"),
        **common,
    )
    bars = [str(out / f"seed_{s}" / "bars.parquet") for s in seeds]
    evaluate_job(
        model=model,
        fold=0,
        seed_indices=seeds,
        model_paths=models,
        config=inputs["config"],
        metrics_paths=[str(out / f"seed_{s}" / "metrics.json") for s in seeds],
        bars_paths=bars,
        **common,
    )
    exports = [str(out / "export" / f"seed_{s}") for s in seeds]
    export_job(model=model, model_paths=models, config=inputs["config"], out_dirs=exports)
    return {"bars": [pl.read_parquet(path) for path in bars], "exports": exports}


@pytest.fixture(scope="module")
def runs(inputs: dict) -> dict:
    return {model: run_model(inputs, model) for model in ZOO}


@pytest.fixture(scope="module")
def test_rows(inputs: dict) -> dict:
    """The fold's test split as the pipeline evaluates it, and its raw rows as plain arrays."""
    plan = FoldPlan.load(inputs["folds_path"])
    window = fold_window(
        load_features(inputs["manifest_path"]), plan, 0, inputs["config"], "cpu", splits=("test",)
    )
    data, frame = window.splits["test"], window.frames["test"]
    assert data.n_rows == frame.height and data.rows is not None
    # MarketData keeps the frame's row order for outright contracts (no continuous symbol here)
    assert data.rows["ts_event"].equals(frame["ts_event"])
    rows = {
        "raw": frame.select(pl.col(name).cast(pl.Float32) for name in window.feature_names).to_numpy(),
        "close": frame["close"].cast(pl.Float64).to_numpy(),
        "segment_start": data.segment_start.numpy(),
        "chain_start": data.chain_start.numpy(),
    }
    path = inputs["root"] / "test_rows.npz"
    np.savez(path, **rows)
    return {
        "path": path,
        "decision": data.is_decision.numpy(),
        "contracts": inputs["config"]["env"]["contracts"],
    }


def reference(inputs: dict, rows_path: Path, directories: list[str]) -> dict:
    script = inputs["root"] / "reference.py"
    script.write_text(REFERENCE, encoding="utf-8")
    out = inputs["root"] / "reference.npz"
    subprocess.run(
        [sys.executable, str(script), str(rows_path), str(out), *directories],
        check=True,
        cwd=inputs["root"],  # not the repository: marketrl is not importable by accident from the cwd
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    with np.load(out) as results:
        return dict(results)


def test_every_export_gives_the_evaluations_positions_without_marketrl(inputs, runs, test_rows) -> None:
    directories = [d for run in runs.values() for d in run["exports"]]
    results = reference(inputs, test_rows["path"], directories)
    decision = test_rows["decision"]
    onnx_kinds, trading = set(), set()
    for model, run in runs.items():
        for bars, directory in zip(run["bars"], run["exports"], strict=True):
            meta = read_export(directory)
            assert meta["model"] == model and meta["format"] == "marketrl-export"
            backends = [name for name in ("torchscript", "onnx", "lightgbm") if meta["files"][name]]
            assert backends, f"{model}: nothing exported"
            if meta["files"]["onnx"]:
                onnx_kinds.add(model)
            expected = bars["position"].to_numpy() / test_rows["contracts"]
            if np.abs(expected).sum() > 0:
                trading.add(model)
            for backend in backends:
                got = results[f"{directory}|{backend}|positions"][decision]
                assert np.array_equal(got, expected), (
                    f"{model} {backend}: positions differ from the evaluation"
                )
                if meta["kind"] == "forecaster":
                    predicted = results[f"{directory}|{backend}|predictions"][decision]
                    wanted = bars["prediction"].to_numpy()
                    # float tolerance relative to the predictions' scale (a sum can cancel to near zero)
                    np.testing.assert_allclose(
                        predicted,
                        wanted,
                        rtol=1e-5,
                        atol=1e-5 * np.abs(wanted).max(),
                        err_msg=f"{model} {backend}",
                    )
    print("trading:", sorted(trading), "onnx:", sorted(onnx_kinds))
    # a model that never trades would prove little: every forecaster trades at this threshold
    assert {model for model, entry in ZOO.items() if entry.kind == "forecaster"} <= trading
    # every torch model exports to ONNX (lightgbm has its own file)
    assert onnx_kinds == set(ZOO) - {"lightgbm"}


def test_export_json_is_plain_and_complete(runs) -> None:
    meta = read_export(runs["mlp"]["exports"][1])
    assert meta["seed_index"] == 1 and meta["fold"] == 0 and meta["kind"] == "forecaster"
    assert len(meta["feature_names"]) == len(meta["normalizer"]["mean"]) == len(meta["normalizer"]["std"])
    assert meta["trading_rule"]["threshold_multiplier"] == RULE["threshold_multiplier"]
    assert meta["trading_rule"]["horizon"] == 2 and meta["window"] == SEQUENCE["window"]
    assert "provenance" in meta and set(meta["sha256"]) == {"model.ts", "model.onnx"}
    agent = read_export(runs["ppo"]["exports"][0])
    assert agent["observation"]["action_positions"] == [-1.0, 0.0, 1.0] and agent["window"] == 2
    lgbm = read_export(runs["lightgbm"]["exports"][0])
    assert lgbm["files"] == {"torchscript": None, "onnx": None, "lightgbm": "model.txt"}
    assert lgbm["onnx_unavailable"]


def test_a_failed_export_leaves_no_directory(inputs, runs, tmp_path) -> None:
    out = [str(tmp_path / "seed_0"), str(tmp_path / "seed_1")]
    models = [
        str(Path(runs["dqn"]["exports"][0]).parents[1] / "seed_0" / "model.pt"),
        str(tmp_path / "missing.pt"),
    ]
    with pytest.raises(Exception, match=r"missing\.pt"):
        export_job(model="dqn", model_paths=models, config=inputs["config"], out_dirs=out)
    assert list(tmp_path.iterdir()) == []


def readme_example() -> str:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## I have an edge, now what", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_runs_on_an_export_and_matches_the_evaluation(inputs, runs, test_rows) -> None:
    code = readme_example()
    assert len([line for line in code.splitlines() if line.strip()]) <= 15  # 15 lines of code
    directory = runs["mlp"]["exports"][0]
    script = inputs["root"] / "readme_example.py"
    script.write_text(
        "import sys, numpy as np\n"
        f"rows = np.load({str(test_rows['path'])!r})\n"
        "raw, close = rows['raw'], rows['close']\n"
        "ends = np.r_[np.flatnonzero(np.diff(rows['segment_start'])) + 1, len(raw)]\n"
        "starts = np.r_[0, ends[:-1]]\n"
        f"export_dir = {directory!r}\n"
        "out = []\n"
        "for a, b in zip(starts, ends):\n"
        "    raw_rows, closes = raw[a:b], close[a:b]\n"
        + "\n".join("    " + line for line in code.splitlines())
        + "\n    out.append(positions)\n"
        "assert 'marketrl' not in sys.modules\n"
        f"np.save({str(inputs['root'] / 'readme.npy')!r}, np.concatenate(out))\n",
        encoding="utf-8",
    )
    subprocess.run(
        [sys.executable, str(script)], check=True, cwd=inputs["root"], env={"PATH": "/usr/bin:/bin"}
    )
    positions = np.load(inputs["root"] / "readme.npy")
    expected = runs["mlp"]["bars"][0]["position"].to_numpy() / test_rows["contracts"]
    # one session = one segment = one chain here (no rolls)
    assert np.array_equal(positions[test_rows["decision"]], expected)


def test_the_export_target_runs_only_export_jobs_and_leaves_the_pipeline_unchanged(
    shared_run: Path, tmp_path: Path
) -> None:
    run = copy_of_shared_run(tmp_path / "run")
    config = load_config(run / "config.yaml")
    result = snakemake("--cores", "1", "export_all", cwd=run, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert set(job_counts(output)) == {"export", "export_all"}  # the trained models are reused as they are
    for directory in pipeline.export_dirs(config):
        meta = read_export(run / directory)
        assert meta["files"]["torchscript"] and (run / directory / meta["files"]["torchscript"]).is_file()
        assert meta["provenance"]["config"] == {"training": {"extra_models": {}}}
    # exports are no input of the pipeline's own target: it still plans nothing
    dry = snakemake("-n", "results/eval_report.html", cwd=run)
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr
