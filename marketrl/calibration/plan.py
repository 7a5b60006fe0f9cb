"""The plan of the verdict's calibration: its settings (the `calibration` config slice), its worlds and how they
are split into jobs. Free of heavy imports: rules/common.smk reads it at every DAG parse; the worlds themselves
run in `marketrl.calibration.worlds` (which also checks the model names against the zoo's registry).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marketrl.settings.config import derive_seed

NO_EDGE = "none"  # the kind of a no-edge world (edge 0: no planted signal, whatever the kind)


class CalibrationError(ValueError):
    """A bad `calibration` config value or a malformed calibration chunk; the message names the key or file."""


@dataclass(frozen=True)
class CalibrationSettings:
    """The `calibration` config slice, checked against the verdict's minimums."""

    worlds: int  # K per arm
    edges: tuple[float, ...]
    test_days: tuple[int, ...]  # pooled out-of-sample days per world, split evenly over `folds`
    folds: int
    train_days: int
    validation_days: int
    models: tuple[str, ...]
    seeds: int
    random_traders: int
    worlds_per_job: int
    per_fold_trials: int = (
        0  # > 0: the nested-tuning arms, each world re-tuned per fold with this many trials
    )
    edge_kinds: tuple[str, ...] = (
        "momentum",
    )  # planted signal kinds (data.demo.edge_kind) of the edge > 0 arms

    def arm_kinds(self, edge: float) -> tuple[str, ...]:
        """The kinds of the arms at `edge`: every kind above 0, one no-edge arm ("none") at 0."""
        return (NO_EDGE,) if edge == 0 else self.edge_kinds

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> CalibrationSettings:
        """Read `config["calibration"]`; every test-day count and the seed count must clear the verdict's
        minimums (a world below them could only say "not enough data")."""
        section = config["calibration"]
        evaluation = config["evaluation"]
        settings = cls(
            worlds=int(section["worlds"]),
            edges=tuple(float(e) for e in section["edges"]),
            test_days=tuple(int(t) for t in section["test_days"]),
            folds=int(section["folds"]),
            train_days=int(section["train_days"]),
            validation_days=int(section["validation_days"]),
            models=tuple(section["models"]),
            seeds=int(section["seeds"]),
            random_traders=int(section["random_traders"]),
            worlds_per_job=int(section["worlds_per_job"]),
            per_fold_trials=int(section.get("per_fold_trials", 0)),
            edge_kinds=tuple(section.get("edge_kinds", ("momentum",))),
        )
        if not settings.edge_kinds or len(set(settings.edge_kinds)) != len(settings.edge_kinds):
            raise CalibrationError(
                "config key 'calibration.edge_kinds': expected distinct kinds (momentum, reversion)"
            )
        for days in settings.test_days:
            if days % settings.folds:
                raise CalibrationError(
                    f"config key 'calibration.test_days': {days} is not a multiple of calibration.folds "
                    f"({settings.folds})"
                )
            if days < evaluation["min_test_days"]:
                raise CalibrationError(
                    f"config key 'calibration.test_days': {days} is below evaluation.min_test_days "
                    f"({evaluation['min_test_days']}); such a world can reach no verdict"
                )
        if settings.seeds < evaluation["min_seeds"]:
            raise CalibrationError(
                f"config key 'calibration.seeds': {settings.seeds} is below evaluation.min_seeds "
                f"({evaluation['min_seeds']}); such a world can reach no verdict"
            )
        if settings.validation_days >= settings.train_days:
            raise CalibrationError(
                "config key 'calibration.validation_days': must be smaller than calibration.train_days"
            )
        return settings


@dataclass(frozen=True)
class WorldSpec:
    """One world: its arm (planted edge and its kind, pooled test days; fixed hyperparameters or, `per_fold`,
    re-tuned per fold) and its index within the arm."""

    edge: float
    test_days: int
    index: int
    per_fold: bool = False
    kind: str = "momentum"  # NO_EDGE at edge 0

    def __post_init__(self) -> None:
        if self.edge == 0:  # no planted signal: the kind is moot, and every kind shares this world
            object.__setattr__(self, "kind", NO_EDGE)

    def seed(self, root_seed: int) -> int:
        """The world's own seed: its data, models, random traders and bootstraps all derive from it. A nested-
        tuning world shares it with the fixed-hyperparameter world of the same index: the same data, a paired
        comparison of the two schemes. Momentum and no-edge worlds keep the seeds they had before kinds
        existed; a reversion world's seed names its kind."""
        if self.kind in ("momentum", NO_EDGE):
            return derive_seed(root_seed, "calibration", f"{self.edge:g}", self.test_days, self.index)
        return derive_seed(root_seed, "calibration", self.kind, f"{self.edge:g}", self.test_days, self.index)

    @property
    def demo_kind(self) -> str:
        """The data.demo.edge_kind the world's data are generated with."""
        return "momentum" if self.kind == NO_EDGE else self.kind


def world_specs(settings: CalibrationSettings) -> list[WorldSpec]:
    """Every world of the calibration, arm by arm (edges and their kinds, then test-day counts), in a fixed order;
    with calibration.per_fold_trials > 0 the nested-tuning arms follow, in the same order."""
    schemes = (False, True) if settings.per_fold_trials > 0 else (False,)
    return [
        WorldSpec(edge, days, k, per_fold, kind)
        for per_fold in schemes
        for edge in settings.edges
        for kind in settings.arm_kinds(edge)
        for days in settings.test_days
        for k in range(settings.worlds)
    ]


def n_jobs(settings: CalibrationSettings) -> int:
    """Jobs the worlds are split into (`calibration.worlds_per_job` worlds each, the last one may hold fewer)."""
    return math.ceil(len(world_specs(settings)) / settings.worlds_per_job)


def job_worlds(settings: CalibrationSettings, job: int) -> list[WorldSpec]:
    """The worlds of job `job` (0-based)."""
    if not 0 <= job < n_jobs(settings):
        raise CalibrationError(f"calibration job {job} does not exist (0..{n_jobs(settings) - 1})")
    size = settings.worlds_per_job
    return world_specs(settings)[job * size : (job + 1) * size]
