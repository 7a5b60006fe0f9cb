"""Export trained models for use outside marketrl: TorchScript (and ONNX where the model allows it), or LightGBM's
own model file, each with an ``export.json`` that says how to turn raw feature rows into positions with plain
numpy and torch (or onnxruntime, or lightgbm).

One directory per seed (`marketrl.settings.paths.EXPORT_DIR`):

    export.json   feature names, normalizer statistics, window, input/output layout, the position rule
                  (an agent's observation and action map, or a forecaster's trading rule as plain numbers),
                  `how_to_use`, provenance
    model.ts      TorchScript (torch.jit.load): agents  (windows [B, W, F], position [B]) -> target position [B],
                  forecasters  windows [B, W, F] -> predicted forward return [B]
    model.onnx    the same graph for onnxruntime (inputs "windows" and, for agents, "position"); absent with the
                  reason in export.json where the exporter cannot take the model
    model.txt     LightGBM only, instead of both: ``lightgbm.Booster(model_file=...)`` on windows flattened to
                  [B, W·F]

The exported modules run in float32 on the CPU: positions equal the pipeline's evaluation where that ran in
fp32 (a bf16/fp16 evaluation on a GPU may differ on rows whose scores nearly tie).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from marketrl.agents.results import AgentPolicy
from marketrl.runtime.io import json_text
from marketrl.runtime.provenance import collect, sha256_file
from marketrl.scoring.metrics import to_json_safe
from marketrl.training.zoo import Exportable, LoadedModel, get_entry

__all__ = ["FORMAT", "VERSION", "AgentPolicy", "ExportError", "export_job", "export_model", "read_export"]

log = logging.getLogger(__name__)

FORMAT = "marketrl-export"
VERSION = 1
EXPORT_JSON = "export.json"
TORCHSCRIPT = "model.ts"
ONNX = "model.onnx"
LIGHTGBM = "model.txt"


class ExportError(ValueError):
    """A checkpoint cannot be exported (one line naming the file)."""


# ------------------------------------------------------------------------------------------------- the JSON


def _normalizer(state: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "mean": list(state["mean"]),
        "std": list(state["std"]),
        "clip": state["clip"],
        "formula": "z = clip((float32(x) - mean) / std, -clip, clip) in float32; a missing (NaN) value -> 0",
    }


def _meta(model: str, kind: str, loaded: LoadedModel, exportable: Exportable) -> dict[str, Any]:
    """export.json without the files, the ONNX outcome and provenance: what every model records, then what its
    zoo entry describes (`Exportable`: the observation's own entries, inputs, output, trading rule, how to use)."""
    extra = loaded.meta.get("extra") or {}
    env = loaded.meta["env"]
    normalizer = loaded.meta["normalizer"]
    feature_names = list(normalizer["feature_names"])
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": model,
        "kind": kind,
        "fold": extra.get("fold"),
        "seed_index": extra.get("seed_index"),
        "seed": extra.get("seed"),
        "feature_names": feature_names,
        "normalizer": _normalizer(normalizer),
        "window": exportable.window,
        "observation": {
            "contracts": env["contracts"],
            "fill": env["fill"],
            "max_gap_seconds": env["max_gap"],
            **exportable.observation,
        },
        "precision": loaded.meta.get("precision"),
        "costs": extra.get("costs"),
        **exportable.fields,
        # the validation gate (marketrl.scoring.gate): on the first fold, set_flat means the pipeline trades this
        # run flat; from the second fold on the model's walk-forward record decides (metrics.json `flat_gate`)
        **(
            {}
            if loaded.gate is None
            else {
                "flat_gate": {
                    **to_json_safe(loaded.gate.to_dict()),
                    "meaning": "the run's validation gate. On the first fold, set_flat true: the pipeline holds "
                    "this run flat on every bar (its validation days showed no edge after costs) and the module's "
                    "own output is not used. From the second fold on, the model's walk-forward record (the "
                    "earlier folds' test days) decides instead: metrics.json 'flat_gate' of the fold's evaluation",
                }
            }
        ),
    }


# ---------------------------------------------------------------------------------------------- the exports


def _example_inputs(names: Sequence[str], window: int, n_features: int) -> tuple[torch.Tensor, ...]:
    """Tracing inputs: ``windows`` [2, window, F], then [2] for each further input (an agent's ``position``)."""
    return (torch.zeros(2, window, n_features), *(torch.zeros(2) for _ in names[1:]))


def _torchscript(module: nn.Module, inputs: tuple[torch.Tensor, ...], path: Path) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        # tracer warnings about python branches on shapes: only the batch varies, and no branch depends on it
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, inputs, check_trace=False)
    traced.save(str(path))


def _onnx(module: nn.Module, inputs: tuple[torch.Tensor, ...], names: list[str], path: Path) -> str | None:
    """Write the ONNX graph; return None, or why the model cannot be exported (recorded in export.json).

    The TorchScript-based exporter first (no extra dependency at run time); where it lacks an operator (the
    transformer's fused encoder layer) the `torch.export` one (``dynamo=True``, needs onnxscript).
    """
    reasons = []
    for dynamo in (False, True):
        try:
            with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                if dynamo:
                    batch = torch.export.Dim("batch", min=1)
                    shapes = tuple({0: batch} for _ in inputs)
                    program = torch.onnx.export(
                        module,
                        inputs,
                        input_names=names,
                        output_names=["output"],
                        dynamic_shapes=shapes,
                        dynamo=True,
                        verbose=False,
                    )
                    program.save(str(path))
                else:
                    axes = {name: {0: "batch"} for name in [*names, "output"]}
                    torch.onnx.export(
                        module,
                        inputs,
                        str(path),
                        input_names=names,
                        output_names=["output"],
                        dynamic_axes=axes,
                        dynamo=False,
                    )
            return None
        except Exception as error:  # the exporters raise many types; the reason goes into export.json
            path.unlink(missing_ok=True)
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            reasons.append(
                f"{'dynamo' if dynamo else 'torchscript'} exporter: {type(error).__name__}: {first_line}"
            )
    reason = "; ".join(reasons)
    log.info("%s: no ONNX export (%s)", path, reason)
    return reason


def export_model(
    model: str,
    model_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    extra_models: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Export one seed's checkpoint into ``out_dir`` (which must exist, empty); return its export.json."""
    entry = get_entry(model, extra_models)
    out = Path(out_dir)
    loaded = entry.load(str(model_path), torch.device("cpu"))
    if loaded.meta.get("env") is None or loaded.meta.get("normalizer") is None:
        raise ExportError(
            f"{model_path}: the checkpoint records no env settings or normalizer; retrain the model"
        )
    n_features = len(loaded.meta["normalizer"]["feature_names"])
    try:
        exportable = entry.exportable(loaded, str(model_path))
    except ValueError as error:
        raise ExportError(str(error)) from None
    meta = _meta(model, entry.kind, loaded, exportable)
    module, booster = exportable.module, exportable.booster
    files: dict[str, str | None] = {"torchscript": None, "onnx": None, "lightgbm": None}
    if module is not None:
        module = module.cpu().eval().requires_grad_(False)  # outputs without grad: `.numpy()` works on them
        names = exportable.input_names
        inputs = _example_inputs(names, exportable.window, n_features)
        _torchscript(module, inputs, out / TORCHSCRIPT)
        files["torchscript"] = TORCHSCRIPT
        reason = _onnx(module, inputs, names, out / ONNX)
        files["onnx"] = None if reason else ONNX
        meta["onnx_unavailable"] = reason
    else:
        (out / LIGHTGBM).write_text(booster, encoding="utf-8")
        files["lightgbm"] = LIGHTGBM
        meta["onnx_unavailable"] = "LightGBM: the booster is exported as its own model file (model.txt)"
    meta["files"] = files
    meta["sha256"] = {name: sha256_file(out / name) for name in files.values() if name}
    return meta


def export_job(
    *,
    model: str,
    model_paths: Sequence[str],
    config: Mapping[str, Any],
    out_dirs: Sequence[str],
) -> list[dict[str, Any]]:
    """The export stage: every seed's checkpoint of one model x fold into its directory, all or none (each
    directory is written beside its destination, then all are renamed into place)."""
    if len(model_paths) != len(out_dirs):
        raise ValueError(f"{model}: {len(model_paths)} checkpoints for {len(out_dirs)} export directories")
    extra_models = config["training"]["extra_models"]
    provenance = collect(dict(config), inputs={path: sha256_file(path) for path in model_paths})
    staged: list[tuple[Path, Path]] = []
    metas = []
    try:
        for model_path, out_dir in zip(model_paths, out_dirs, strict=True):
            dest = Path(out_dir)
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
            staged.append((tmp, dest))
            meta = export_model(model, model_path, tmp, extra_models)
            meta["provenance"] = provenance
            (tmp / EXPORT_JSON).write_text(json_text(meta), encoding="utf-8")
            metas.append(meta)
        renamed = []
        try:
            for tmp, dest in staged:
                if dest.exists():
                    shutil.rmtree(dest)
                os.replace(tmp, dest)
                renamed.append(dest)
        except BaseException:
            for dest in renamed:
                shutil.rmtree(dest, ignore_errors=True)
            raise
    finally:
        for tmp, _ in staged:
            shutil.rmtree(tmp, ignore_errors=True)
    return metas


def read_export(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """An export directory's export.json."""
    return json.loads((Path(directory) / EXPORT_JSON).read_text(encoding="utf-8"))
