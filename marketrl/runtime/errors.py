"""Which exceptions are a person's to fix (bad data, bad config, a file of the wrong run) and which are bugs.

A job that fails with a known error prints its one-line message and no traceback on the console (the traceback
goes to the job's log file); any other exception is a bug and keeps its traceback on the console
(`marketrl.runtime.jobs.job_context`). The classes are named here by dotted path rather than imported, so that
every job can ask without importing torch, polars or the data readers; tests/test_runtime_errors.py checks that
each name resolves and that every error class of `marketrl` and `gpu_utils` is known (listed or a subclass of a
listed class) or internal, never both.
"""

from __future__ import annotations

__all__ = ["INTERNAL_ERRORS", "KNOWN_ERRORS", "is_known_error", "one_line"]

# Bad input data or configuration: the message names the file or config key and says what is wrong. Subclasses
# count too (DataConfigError is a DataFileError).
KNOWN_ERRORS: frozenset[str] = frozenset(
    {
        "marketrl.agents.checkpoint.CheckpointError",
        "marketrl.agents.spec.ArchitectureError",
        "marketrl.calendars.sessions.SessionConfigError",
        "marketrl.data.download.DownloadError",
        "marketrl.data.checks.DataFileError",
        "marketrl.features.user.UserFeatureError",
        "marketrl.env.config.EnvConfigError",
        "marketrl.env.config.EnvDataError",
        "marketrl.instruments.costs.CostConfigError",
        "marketrl.evaluation.evaluate.TrainedSettingsError",
        "marketrl.evaluation.predict.PredictInputError",
        "marketrl.evaluation.replay.ReplayError",
        "marketrl.loop.hparams.AgentConfigError",
        "marketrl.loop.hparams.HParamError",
        "marketrl.models.supervised_data.ModelDataError",
        "marketrl.verdict.inputs.ReportInputError",
        "marketrl.splits.datasets.DatasetError",
        "marketrl.splits.folds.FoldError",
        "marketrl.training.dashboard.DashboardError",
        "marketrl.training.export.ExportError",
        "marketrl.training.study_storage.HyperoptError",
        "marketrl.training.train.HparamsError",
        "marketrl.calibration.plan.CalibrationError",
        "marketrl.settings.config.ConfigError",
        "marketrl.data.file_order.DbnHeaderError",
        "marketrl.settings.registry.RegistryError",
        "gpu_utils.budget.BudgetError",
        "gpu_utils.device.DeviceError",
        "gpu_utils.precision.PrecisionError",
    }
)

# Raised when one of our modules hands another input it should never get (or, for NonFiniteError, when training
# diverges, which is worth a traceback): a traceback on the console helps whoever fixes it.
INTERNAL_ERRORS: frozenset[str] = frozenset(
    {
        "marketrl.evaluation.nautilus_replay.ReplayEngineError",  # NautilusTrader refused our order schedule
        "marketrl.scoring.metrics.MetricsInputError",
        "marketrl.scoring.stats.StatsInputError",
        "marketrl.splits.normalize.NormalizerError",
        "marketrl.workflow.stages.StageError",
        "gpu_utils.metrics.NonFiniteError",
    }
)


def _dotted(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def is_known_error(exc: BaseException) -> bool:
    """True when ``exc`` is one of ``KNOWN_ERRORS`` (or a subclass): bad data or config, not a bug."""
    return any(_dotted(cls) in KNOWN_ERRORS for cls in type(exc).__mro__)


def one_line(exc: BaseException) -> str:
    """``<Type>: <message>``, cut at the message's first line break."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0]
