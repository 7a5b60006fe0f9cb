"""Agent checkpoints: plain data only, written atomically, loaded with ``torch.load(weights_only=True)``.

A checkpoint is a dict of tensors, lists, numbers, strings, booleans and None:

    format "marketrl-agent", version 1, algo (the agent's registered name),
    architecture   the dict `networks.build_networks` rebuilds the exact networks from,
    state_dicts    one per network of the agent's spec: {"q": {...}} or {"policy": {...}, "value": {...}}
                   (CPU float32 tensors),
    normalizer     FeatureNormalizer.state_dict() of the training split,
    feature_names  feature columns in observation order,
    env            the environment settings the agent was trained with (window, fill, contracts, ...),
    precision      PrecisionPlan.to_dict() of the training run,
    hparams        resolved hyperparameters (defaults included),
    extra          anything else the caller adds (plain data only).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from gpu_utils import PrecisionError, PrecisionPlan, detect_precision
from marketrl.agents.common import GreedyPolicy, TrainResult
from marketrl.agents.networks import build_networks
from marketrl.agents.spec import AgentSpec, ArchitectureError, agent_spec
from marketrl.runtime.io import atomic_open

__all__ = ["CheckpointError", "load_agent", "load_checkpoint", "load_policy", "save_agent", "save_checkpoint"]

log = logging.getLogger(__name__)

FORMAT = "marketrl-agent"
VERSION = 1
_PLAIN = (str, int, float, bool, type(None), torch.Tensor)


class CheckpointError(ValueError):
    """A checkpoint cannot be written or read back as an agent."""


def save_checkpoint(
    path: str | os.PathLike[str],
    result: TrainResult,
    *,
    algo: str,
    normalizer_state: Mapping[str, Any],
    feature_names: list[str],
    precision: PrecisionPlan | Mapping[str, Any] | None = None,
    hparams: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    spec: AgentSpec | None = None,
) -> None:
    """Write ``result``'s networks and everything needed to rebuild and feed them, atomically.

    ``precision`` and ``hparams`` default to the ones recorded in ``result``; ``spec``: the agent (default: the
    registered one named ``algo``), whose networks are saved.
    """
    if algo != result.algo:
        raise CheckpointError(f"{path}: algo {algo!r} does not match the trained agent ({result.algo!r})")
    spec = _spec_of(algo, spec, str(path))
    if precision is None:
        precision = result.precision
    checkpoint = {
        "format": FORMAT,
        "version": VERSION,
        "algo": algo,
        "architecture": result.architecture,
        "state_dicts": {
            name: {
                key: value.detach().to("cpu", copy=True)
                for key, value in result.networks[name].state_dict().items()
            }
            for name in spec.networks
        },
        "normalizer": dict(normalizer_state),
        "feature_names": list(feature_names),
        "env": result.log.get("env"),
        "precision": precision.to_dict() if isinstance(precision, PrecisionPlan) else dict(precision),
        "hparams": dict(hparams if hparams is not None else result.hparams),
        "extra": dict(extra or {}),
    }
    _check_plain(checkpoint, str(path), "checkpoint")
    # Saved through a handle, not the temp path: torch names the zip's root after a path, which would make the
    # same weights give different bytes on every write.
    with atomic_open(path, "wb") as handle:
        torch.save(checkpoint, handle)


def load_checkpoint(
    path: str | os.PathLike[str], device: torch.device | str = "cpu", spec: AgentSpec | None = None
) -> dict[str, Any]:
    """The checkpoint dict (tensors mapped to ``device``), validated; ``torch.load(weights_only=True)``.

    ``spec``: the agent expected (default: any registered agent)."""
    try:
        checkpoint = torch.load(path, map_location=torch.device(device), weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: checkpoint not found") from None
    except Exception as error:  # unpickling errors come in several types
        raise CheckpointError(
            f"{path}: not a readable weights-only checkpoint ({type(error).__name__})"
        ) from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a marketrl agent checkpoint")
    if checkpoint.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint version {checkpoint.get('version')!r}, expected {VERSION}")
    _spec_of(checkpoint.get("algo"), spec, str(path))
    return checkpoint


def _spec_of(algo: Any, spec: AgentSpec | None, path: str) -> AgentSpec:
    """The agent of a checkpoint's ``algo``: ``spec`` if given (and it is that agent), else the registered one."""
    if spec is not None:
        if algo != spec.name:
            raise CheckpointError(f"{path}: a {algo!r} checkpoint, expected {spec.name!r}")
        return spec
    try:
        return agent_spec(str(algo))
    except ArchitectureError as error:
        raise CheckpointError(f"{path}: {error}") from None


def load_policy(
    path: str | os.PathLike[str],
    device: torch.device | str = "cpu",
    precision: str | None = None,
    spec: AgentSpec | None = None,
) -> tuple[GreedyPolicy, dict[str, Any]]:
    """Rebuild the trained networks from the checkpoint alone; return (greedy policy, metadata).

    ``spec``: the agent expected (default: the registered agent the checkpoint's ``algo`` names).
    The policy runs in the training precision where ``device`` supports it (else fp32, logged), or in
    ``precision`` (auto/bf16/fp16/fp32) if given. ``metadata`` is the checkpoint without ``state_dicts``, plus
    ``networks`` (the rebuilt modules, in eval mode) and ``plan`` (the PrecisionPlan used).
    """
    device = torch.device(device)
    checkpoint = load_checkpoint(path, device, spec)
    spec = _spec_of(checkpoint["algo"], spec, str(path))
    try:
        networks = build_networks(checkpoint["architecture"], spec)
    except ArchitectureError as error:
        raise CheckpointError(f"{path}: {error}") from None
    for name, module in networks.items():
        try:
            module.load_state_dict(checkpoint["state_dicts"][name])
        except (KeyError, RuntimeError) as error:
            raise CheckpointError(
                f"{path}: weights for {name!r} do not fit the stored architecture ({error})"
            ) from None
        module.to(device).eval().requires_grad_(False)
    plan = _inference_plan(device, precision or checkpoint["precision"].get("mode", "fp32"), str(path))
    meta = {key: value for key, value in checkpoint.items() if key != "state_dicts"}
    meta.update(networks=networks, plan=plan)
    return GreedyPolicy(networks[spec.acting_network], plan), meta


def save_agent(
    spec: AgentSpec,
    path: str | os.PathLike[str],
    result: TrainResult,
    *,
    hparams: Mapping[str, Any],
    precision: PrecisionPlan | Mapping[str, Any],
    normalizer: Mapping[str, Any],
    feature_names: Sequence[str],
    env: Mapping[str, Any],
    extra: Mapping[str, Any],
) -> None:
    """An agent's `ModelSpec.save` (``AgentSpec.saver``): `save_checkpoint` of ``spec``'s networks with the
    run's ``hparams`` and ``precision``; the env settings come from the result's log (``env`` is the same run's)."""
    save_checkpoint(
        path,
        result,
        algo=spec.name,
        normalizer_state=normalizer,
        feature_names=list(feature_names),
        precision=precision,
        hparams=dict(hparams),
        extra=dict(extra),
        spec=spec,
    )


def load_agent(
    spec: Any, path: str | os.PathLike[str], device: torch.device
) -> tuple[TrainResult, dict[str, Any]]:
    """An agent's `ModelSpec.load_path` (``AgentSpec.loader``): `load_policy` as a `TrainResult` (the rebuilt
    networks, the greedy policy, the stored architecture, hyperparameters and the inference precision plan;
    an empty log) and its metadata."""
    policy, meta = load_policy(path, device, spec=spec)
    result = TrainResult(
        algo=spec.name,
        networks=meta["networks"],
        policy=policy,
        architecture=meta["architecture"],
        hparams=dict(meta["hparams"]),
        precision=meta["plan"],
    )
    return result, meta


def _inference_plan(device: torch.device, mode: str, where: str) -> PrecisionPlan:
    try:
        return detect_precision(device, mode)
    except PrecisionError:
        log.info("%s: trained in %s, which %s cannot run; evaluating in fp32", where, mode, device)
        return detect_precision(device, "fp32")


def _check_plain(value: Any, path: str, where: str) -> None:
    """Refuse anything ``torch.load(weights_only=True)`` would reject, naming where it sits."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str | int):
                raise CheckpointError(f"{path}: {where} has a non-string key {key!r}")
            _check_plain(item, path, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_plain(item, path, f"{where}[{index}]")
    elif not isinstance(value, _PLAIN):
        raise CheckpointError(f"{path}: {where} holds a {type(value).__name__}; only plain data can be saved")
