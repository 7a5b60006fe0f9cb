"""Workflow plumbing that rules/common.smk calls: which files exist, which jobs run, where outputs go.

Kept free of heavy imports (no torch/polars) because Snakemake re-parses the workflow for every job.
"""

from __future__ import annotations

import datetime as dt
import glob
import json
from pathlib import Path
from typing import Any

from marketrl.calendars.cme_hours import demo_file_days
from marketrl.data.file_order import (
    CONTEXT_FILES,
    DBN_SUFFIX,
    DEMO_DEFINITIONS_DIR,
    DEMO_QUOTES_DIR,
    DbnHeaderError,
    dbn_stem,
    demo_definition_name,
    demo_file_name,
    demo_quote_file_name,
    header_span_ns,
    header_start_ns,
    time_ordered,
)
from marketrl.settings import paths
from marketrl.settings.config import ConfigError
from marketrl.settings.registry import DETERMINISTIC


def weekdays(start: dt.date, n_days: int | None = None, end: dt.date | None = None) -> list[dt.date]:
    """Weekdays from `start`: the first `n_days` of them, or all before `end` (exclusive)."""
    days: list[dt.date] = []
    day = start
    while (n_days is not None and len(days) < n_days) or (end is not None and day < end):
        if day.weekday() < 5:
            days.append(day)
        day += dt.timedelta(days=1)
    return days


def demo_files(config: dict[str, Any]) -> list[str]:
    """The ohlcv-1m files the demo_data rule writes: one per UTC day holding bars of the CME sessions."""
    demo = config["data"]["demo"]
    days = demo_file_days(dt.date.fromisoformat(demo["start"]), demo["days"])
    return [f"{paths.DEMO_DIR}/{demo_file_name(d)}" for d in days]


def demo_quote_files(config: dict[str, Any]) -> list[str]:
    """The bbo-1m files the demo_data rule writes (bbo-1m/), one per UTC day of the ohlcv-1m ones."""
    demo = config["data"]["demo"]
    days = demo_file_days(dt.date.fromisoformat(demo["start"]), demo["days"])
    return [f"{paths.DEMO_DIR}/{DEMO_QUOTES_DIR}/{demo_quote_file_name(d)}" for d in days]


def demo_outputs(config: dict[str, Any]) -> list[str]:
    """Everything the demo_data rule writes: the ohlcv-1m files, the bbo-1m files (bbo-1m/) and the definition
    file (definitions/)."""
    demo = config["data"]["demo"]
    days = demo_file_days(dt.date.fromisoformat(demo["start"]), demo["days"])
    return [
        *demo_files(config),
        *demo_quote_files(config),
        f"{paths.DEMO_DIR}/{DEMO_DEFINITIONS_DIR}/{demo_definition_name(days[0], days[-1])}",
    ]


# A bar file's quotes come from the quote files of its own span and of this much around it (the quotes as of
# its first bar's open and its last bar's close may sit in the neighbouring days' files).
QUOTE_MARGIN_NS = 15 * 60 * 1_000_000_000
DEMO_QUOTES = "demo"


def quote_inputs(config: dict[str, Any]) -> dict[str, list[str]]:
    """``data.quotes``: per bar file's stem, the quote files joined to its bars (its own span's first, then the
    neighbours within ``QUOTE_MARGIN_NS``); {} without quotes. ``"demo"`` is the demo's own bbo-1m files (each
    day's, with the days before and after) under data.source: demo, and none under another source; a glob (data.source: files) is paired by the
    files' header spans. A quote file that pairs with no bar file, or a bar file without a quote file of its
    own span, is a ConfigError naming the file."""
    pattern = config["data"].get("quotes", "")
    if not pattern.strip():
        return {}
    source = config["data"]["source"]
    if pattern == DEMO_QUOTES:
        if source != "demo":  # the default config's value: other sources have no demo quotes
            return {}
        demo = config["data"]["demo"]
        days = demo_file_days(dt.date.fromisoformat(demo["start"]), demo["days"])
        quote_of = dict(zip(days, demo_quote_files(config), strict=True))
        one = dt.timedelta(days=1)
        return {
            file_stem(bar): [quote_of[d] for d in (day, day - one, day + one) if d in quote_of]
            for day, bar in zip(days, demo_files(config), strict=True)
        }
    if source != "files":
        raise ConfigError("config key 'data.quotes': a glob of quote files needs data.source: files")
    matched = sorted(glob.glob(pattern, recursive=True))
    if not matched:
        raise ConfigError(f"config key 'data.quotes': glob {pattern!r} matched no files")
    try:
        quote_spans = {path: header_span_ns(path) for path in matched}
        bar_spans = {stem: header_span_ns(path) for stem, path in raw_data_files(config).items()}
    except DbnHeaderError as exc:
        raise ConfigError(f"config key 'data.quotes': {exc}") from None
    paired: dict[str, list[str]] = {}
    used: set[str] = set()
    for stem, span in bar_spans.items():
        own, near = _paired_quotes(span, quote_spans)
        if not own:
            raise ConfigError(f"config key 'data.quotes': no quote file covers the span of {stem}")
        paired[stem] = own + near
        used.update(own)
    used.update(
        _quotes_of_new_files(config, quote_spans)
    )  # the new files' days (predict.files) may be there too
    unused = [q for q in matched if q not in used]
    if unused:
        raise ConfigError(f"config key 'data.quotes': {unused[0]} covers the span of no bar file (its bars?)")
    return paired


def _paired_quotes(
    span: tuple[int, int], quote_spans: dict[str, tuple[int, int]]
) -> tuple[list[str], list[str]]:
    """The quote files whose header spans overlap a bar file's ``span`` (its own), and those within
    ``QUOTE_MARGIN_NS`` of it (the neighbours, for the quotes around its first and last bar)."""
    start, end = span
    own = [q for q, (qs, qe) in quote_spans.items() if qs < end and start < qe]
    near = [
        q
        for q, (qs, qe) in quote_spans.items()
        if q not in own and qs < end + QUOTE_MARGIN_NS and start - QUOTE_MARGIN_NS < qe
    ]
    return own, near


def _quotes_of_new_files(config: dict[str, Any], quote_spans: dict[str, tuple[int, int]]) -> set[str]:
    """The quote files that cover a new file of ``predict.files`` (none without one)."""
    if not config.get("predict", {}).get("files", "").strip():
        return set()
    try:
        spans = [header_span_ns(path) for path in predict_files(config).values()]
    except DbnHeaderError as exc:
        raise ConfigError(f"config key 'predict.files': {exc}") from None
    return {q for span in spans for q in _paired_quotes(span, quote_spans)[0]}


def predict_quote_inputs(config: dict[str, Any], stem: str) -> list[str]:
    """``data.quotes`` for a new file of ``predict.files``, paired as ``quote_inputs`` pairs a training file (its
    own span's quote files first, then the neighbours; the demo's bbo-1m files by their header spans), so that
    predict's fills pay the spreads evaluation's do; [] where the training files have no quote files. A new file
    that no quote file covers is a ConfigError naming it."""
    pattern = config["data"].get("quotes", "").strip()
    if not pattern or (pattern == DEMO_QUOTES and config["data"]["source"] != "demo"):
        return []
    new = predict_files(config)[stem]
    candidates = (
        demo_quote_files(config) if pattern == DEMO_QUOTES else sorted(glob.glob(pattern, recursive=True))
    )
    try:
        quote_spans = {path: header_span_ns(path) for path in candidates if Path(path).is_file()}
        own, near = _paired_quotes(header_span_ns(new), quote_spans)
    except DbnHeaderError as exc:
        raise ConfigError(f"config key 'data.quotes': {exc}") from None
    if not own:
        raise ConfigError(
            f"config key 'data.quotes': no quote file covers the span of the new file {new} (predict.files); the "
            "models were evaluated with quote-aware fills, so predict needs the quotes of its days too"
        )
    return own + near


def batch_file_days(dataset: str, start: dt.date, end: dt.date) -> list[dt.date]:
    """The UTC days in [start, end) a daily batch download of `dataset` has files for: CME Globex (GLBX.*)
    opens on Sunday evening, so its Sunday UTC days hold data; other datasets trade on weekdays only."""
    if not dataset.upper().startswith("GLBX"):
        return weekdays(start, end=end)
    n_days = (end - start).days
    return [day for day in (start + dt.timedelta(days=i) for i in range(n_days)) if day.weekday() != 5]


def databento_files(config: dict[str, Any]) -> list[str]:
    """Paths the optional download writes: one file per UTC day with data in [start, end) (`batch_file_days`)."""
    spec = config["data"]["databento"]
    start, end = dt.date.fromisoformat(spec["start"]), dt.date.fromisoformat(spec["end"])
    if end <= start:
        raise ConfigError(
            f"config key 'data.databento.end': must be after data.databento.start ({end} <= {start})"
        )
    dataset = spec["dataset"].lower().replace(".", "-")
    return [
        f"{paths.DATABENTO_DIR}/{dataset}-{d:%Y%m%d}.{spec['schema']}{DBN_SUFFIX}"
        for d in batch_file_days(spec["dataset"], start, end)
    ]


def file_stem(path: str) -> str:
    """Name of a DBN file without directory and .dbn.zst / .dbn suffix (the features' wildcard)."""
    try:
        return dbn_stem(path)
    except DbnHeaderError as exc:
        raise ConfigError(str(exc)) from None


def _stems(paths: list[str], key: str) -> dict[str, str]:
    """`paths` keyed by their stems; two files with one stem are an error naming `key`."""
    files: dict[str, str] = {}
    for path in paths:
        stem = file_stem(path)
        if stem in files:
            raise ConfigError(
                f"config key '{key}': two files share the name {stem}: {files[stem]} and {path}"
            )
        files[stem] = path
    return files


def raw_data_files(config: dict[str, Any]) -> dict[str, str]:
    """Every input DBN file keyed by its stem, in time order (header start; the demo and download names are dates)."""
    source = config["data"]["source"]
    if source == "demo":
        paths = demo_files(config)
    elif source == "databento":
        paths = databento_files(config)
    else:
        pattern = config["data"]["files"]
        if not pattern.strip():
            raise ConfigError(
                "config key 'data.files': empty glob; data.source=files needs a glob of .dbn.zst files"
            )
        matched = glob.glob(pattern, recursive=True)
        if not matched:
            raise ConfigError(f"config key 'data.files': glob {pattern!r} matched no files")
        skip = config["data"].get("on_bad_file", "error") == "skip"
        try:
            paths = [str(p) for p in time_ordered(matched, skip_unreadable=skip)]  # by the data's time
        except DbnHeaderError as exc:
            raise ConfigError(f"config key 'data.files': {exc}") from None
    return _stems(paths, "data.files")


def previous_files(config: dict[str, Any], stem: str, k: int = CONTEXT_FILES) -> list[str]:
    """The (up to) `k` files before `stem`, in time order: the lookback context of its features (none for the
    first file)."""
    files = raw_data_files(config)
    stems = list(files)
    position = stems.index(stem)
    return [files[s] for s in stems[max(0, position - k) : position]]


def feature_files(config: dict[str, Any]) -> list[str]:
    """One Parquet feature table per input file."""
    return [paths.FEATURES.format(stem=stem) for stem in raw_data_files(config)]


BATCH_MONTH = "month"


def _file_days(config: dict[str, Any]) -> dict[str, dt.date | None]:
    """Each input file's stem -> the UTC day its data starts (demo and download: the day of its name; own files:
    its header's start), None for a file whose header cannot be read (``data.on_bad_file: skip``)."""
    files = raw_data_files(config)
    source = config["data"]["source"]
    if source == "demo":
        demo = config["data"]["demo"]
        days: list[dt.date | None] = list(demo_file_days(dt.date.fromisoformat(demo["start"]), demo["days"]))
        return dict(zip(files, days, strict=True))
    if source == "databento":
        spec = config["data"]["databento"]
        start, end = dt.date.fromisoformat(spec["start"]), dt.date.fromisoformat(spec["end"])
        return dict(zip(files, batch_file_days(spec["dataset"], start, end), strict=True))
    starts: dict[str, dt.date | None] = {}
    for stem, path in files.items():
        try:
            ns = header_start_ns(path)
        except DbnHeaderError:  # raw_data_files let it through: data.on_bad_file is skip
            starts[stem] = None
            continue
        starts[stem] = dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).date()
    return starts


def feature_batches(config: dict[str, Any]) -> dict[str, list[str]]:
    """``features.batch``: the files (stems, in time order) of each features job, keyed by the batch's name.
    ``month``: the files whose data starts in one calendar month (UTC), named ``YYYY-MM``; ``file``: one job per
    file, named by its stem. An unreadable file (``data.on_bad_file: skip``) is a batch of its own, so that its
    skip touches no other file's job."""
    if config["features"]["batch"] != BATCH_MONTH:
        per_file = {stem: [stem] for stem in raw_data_files(config)}
        _check_rule_names(per_file)
        return per_file
    batches: dict[str, list[str]] = {}
    for stem, day in _file_days(config).items():
        batches.setdefault(stem if day is None else f"{day:%Y-%m}", []).append(stem)
    return batches


def _check_rule_names(batches: dict[str, list[str]]) -> None:
    """Two batch names that give one rule name (stems differing only in punctuation) are a config error."""
    seen: dict[str, str] = {}
    for batch in batches:
        other = seen.setdefault(feature_rule_name(batch), batch)
        if other != batch:
            raise ConfigError(
                f"config key 'features.batch': files {other} and {batch} give one rule name; use features.batch: month"
            )


def feature_rule_name(batch: str) -> str:
    """The name of the features rule of one batch (``features_2024_02``): Snakemake needs one rule per batch,
    since a rule's outputs cannot depend on a wildcard."""
    return "features_" + "".join(c if c.isalnum() else "_" for c in batch)


def feature_batch_files(
    files: dict[str, str], stems: list[str], quotes: dict[str, list[str]], k: int = CONTEXT_FILES
) -> list[dict[str, Any]]:
    """Per file of a features batch (``stems``, time order): its table (``dst``), its DBN file (``src``), the
    (up to) ``k`` files before it in ``files`` (every input file by stem, time order: ``raw_data_files``) as
    lookback ``context``, as when each file had its own job, and its ``data.quotes`` files (``quotes``:
    ``quote_inputs``). A batch's first file takes its context from the batch before."""
    order = list(files)
    batch = []
    for stem in stems:
        position = order.index(stem)
        batch.append(
            {
                "dst": paths.FEATURES.format(stem=stem),
                "src": files[stem],
                "context": [files[s] for s in order[max(0, position - k) : position]],
                "quotes": list(quotes.get(stem, [])),
            }
        )
    return batch


def rule_stage(rule: str) -> str:
    """The stage a rule runs: a batch's features rule (``feature_rule_name``) is ``features``, ``train_folds``
    (every fold of a model in one job) ``train``, a ``*_once`` rule (one run of a deterministic model) its
    model x fold stage, any other rule its own name."""
    if rule.startswith("features_"):
        return "features"
    if rule == "train_folds":  # every fold of a model in one job (training.batch_folds)
        return "train"
    return rule.removesuffix("_once")


def fold_indices(config: dict[str, Any]) -> list[int]:
    """Fold numbers 0..n-1."""
    return list(range(config["folds"]["n"]))


def seed_indices(config: dict[str, Any], model: str | None = None) -> list[int]:
    """Seed indices 0..seeds-1 per model and fold; [0] for a deterministic model (`registry.DETERMINISTIC`),
    whose seeds could not differ."""
    if model is not None and model in DETERMINISTIC:
        return [0]
    return list(range(config["training"]["seeds"]))


def stochastic_models(config: dict[str, Any]) -> list[str]:
    """The models of training.models trained with every seed (one train job per model x fold for them all)."""
    return [model for model in config["training"]["models"] if model not in DETERMINISTIC]


def deterministic_models(config: dict[str, Any]) -> list[str]:
    """The models of training.models trained once per fold (seed 0)."""
    return [model for model in config["training"]["models"] if model in DETERMINISTIC]


def gpu_units(config: dict[str, Any]) -> int:
    """`resources: gpu=` of GPU-using rules, from training.gpu_jobs (auto: 1 unless training runs on the CPU).

    With the default profile's global gpu=1 this keeps two GPU jobs from sharing a device, while CPU-only machines
    still run training jobs in parallel. On a SLURM cluster gpu=1 becomes a GPU request (profiles/slurm); set
    training.gpu_jobs: always when the submit host has no GPU but the compute nodes do, never to request none.
    """
    policy = config["training"].get("gpu_jobs", "auto")
    if policy != "auto":
        return 1 if policy == "always" else 0
    device = config["training"]["device"]
    if device == "cpu":
        return 0
    if device.startswith("cuda"):
        return 1
    return 1 if Path("/proc/driver/nvidia/gpus").exists() else 0


def batch_folds(config: dict[str, Any]) -> bool:
    """Whether one train job per model trains every fold (training.batch_folds; auto: where training runs on a
    GPU, by `gpu_units`' reading of training.device, since a CPU trains fold jobs side by side on its cores)."""
    value = config["training"].get("batch_folds", "auto")
    if value == "auto":
        policy = {**config["training"], "gpu_jobs": "auto"}
        return gpu_units({**config, "training": policy}) == 1
    return bool(value)


def _runs(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (model, fold, seed) job of the fan-out, as the wildcards {model}, {fold} and {seed}."""
    return [
        {"model": model, "fold": fold, "seed": seed}
        for model in config["training"]["models"]
        for fold in fold_indices(config)
        for seed in seed_indices(config, model)
    ]


def model_files(config: dict[str, Any]) -> list[str]:
    """Every trained model of the fan-out."""
    return [paths.MODEL.format(**run) for run in _runs(config)]


def train_log_files(config: dict[str, Any]) -> list[str]:
    """Training logs of every model (the report's training curves)."""
    return [paths.TRAIN_LOG.format(**run) for run in _runs(config)]


def eval_files(config: dict[str, Any]) -> list[str]:
    """Every per-seed evaluation and every per-fold baseline evaluation the report reads."""
    agents = [paths.EVAL_METRICS.format(**run) for run in _runs(config)]
    return agents + [paths.BASELINE_METRICS.format(fold=fold) for fold in fold_indices(config)]


def eval_bar_files(config: dict[str, Any]) -> list[str]:
    """The per-bar table of every file of `eval_files`, in the same order."""
    agents = [paths.EVAL_BARS.format(**run) for run in _runs(config)]
    return agents + [paths.BASELINE_BARS.format(fold=fold) for fold in fold_indices(config)]


def export_dirs(config: dict[str, Any]) -> list[str]:
    """Every seed's export directory (the `export` convenience target; not part of `all`)."""
    return [paths.EXPORT_DIR.format(**run) for run in _runs(config)]


def per_fold(config: dict[str, Any]) -> bool:
    """Nested tuning (hyperopt.per_fold): one study per model x fold instead of one per model."""
    return bool(config["hyperopt"].get("per_fold", False))


def hyperopt_worker_files(config: dict[str, Any], model: str, fold: int | str | None = None) -> list[str]:
    """Summaries of the workers of one model's study (with `fold`: of that fold's study, hyperopt.per_fold)."""
    workers = range(config["hyperopt"]["workers"])
    if fold is None:
        return [paths.HYPEROPT_WORKER.format(model=model, worker=w) for w in workers]
    return [paths.HYPEROPT_FOLD_WORKER.format(model=model, fold=fold, worker=w) for w in workers]


def hyperopt_best_file(config: dict[str, Any], model: str, fold: int | str) -> str:
    """The best hyperparameters fold `fold` of `model` trains with: its own study's under hyperopt.per_fold,
    else the model's one study's."""
    if per_fold(config):
        return paths.HYPEROPT_FOLD_BEST.format(model=model, fold=fold)
    return paths.HYPEROPT_BEST.format(model=model)


def hyperopt_files(config: dict[str, Any]) -> list[str]:
    """Every study's best hyperparameters (training.models, the wildcard {model}): one per
    model, or one per model x fold under hyperopt.per_fold."""
    models = config["training"]["models"]
    if per_fold(config):
        return [
            paths.HYPEROPT_FOLD_BEST.format(model=model, fold=fold)
            for model in models
            for fold in fold_indices(config)
        ]
    return [paths.HYPEROPT_BEST.format(model=model) for model in models]


# ------------------------------------------------------------------------------------------------------- predict


def predict_files(config: dict[str, Any]) -> dict[str, str]:
    """The new DBN files of predict.files keyed by stem, in time order ({} when the glob is empty)."""
    pattern = config["predict"]["files"]
    if not pattern.strip():
        return {}
    matched = glob.glob(pattern, recursive=True)
    if not matched:
        raise ConfigError(f"config key 'predict.files': glob {pattern!r} matched no files")
    try:
        ordered = [str(p) for p in time_ordered(matched)]
    except DbnHeaderError as exc:
        raise ConfigError(f"config key 'predict.files': {exc}") from None
    return _stems(ordered, "predict.files")


def predict_context(config: dict[str, Any], stem: str, k: int = CONTEXT_FILES) -> list[str]:
    """The lookback context of a new file's features, as the features stage gives a training file: the (up to)
    `k` files that start before it among the training inputs and predict.files, in time order. The training
    inputs must exist (predict applies the models of a finished run)."""
    new = predict_files(config)[stem]
    candidates = list(dict.fromkeys([*raw_data_files(config).values(), *predict_files(config).values()]))
    missing = [path for path in candidates if not Path(path).is_file()]
    if missing:
        raise ConfigError(
            f"config key 'predict.files': the training input {missing[0]} does not exist yet; run the pipeline "
            "before predict"
        )
    try:
        start = header_start_ns(new)
        earlier = [str(p) for p in time_ordered(candidates) if header_start_ns(p) < start]
    except DbnHeaderError as exc:
        raise ConfigError(f"config key 'predict.files': {exc}") from None
    return earlier[-k:]


def predict_models(config: dict[str, Any], verdict_path: str = paths.VERDICT) -> list[str]:
    """The models predict applies: predict.models; when it is [], the models the finished run's report says beat
    every baseline (`verdict_path`, written by the report), or every model of training.models when none does or
    there is no report yet."""
    if config["predict"]["models"]:
        return list(config["predict"]["models"])
    trained = list(config["training"]["models"])
    try:
        with open(verdict_path, encoding="utf-8") as handle:
            winners = json.load(handle)["winners"]
    except FileNotFoundError:
        return trained
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"config key 'predict.models' is []: cannot read the winners from {verdict_path}: {exc}"
        ) from None
    return [model for model in trained if model in winners] or trained


def predict_fold(config: dict[str, Any]) -> int:
    """The fold whose trained models predict applies (predict.fold; -1 = the last)."""
    fold = config["predict"]["fold"]
    return fold if fold >= 0 else config["folds"]["n"] - 1


def predict_model_files(config: dict[str, Any], model: str) -> list[str]:
    """Every seed's checkpoint of `model` in the fold predict applies."""
    fold = predict_fold(config)
    return [paths.MODEL.format(model=model, fold=fold, seed=seed) for seed in seed_indices(config, model)]


def record_metrics_files(config: dict[str, Any], model: str, fold: int) -> list[str]:
    """The metrics.json of every seed of `model` in the folds before `fold`: the walk-forward record that decides
    whether the model trades fold `fold` (marketrl.scoring.gate); none without training.record_min_t."""
    if config["training"]["record_min_t"] is None:
        return []
    return [
        paths.EVAL_METRICS.format(model=model, fold=earlier, seed=seed)
        for earlier in range(fold)
        for seed in seed_indices(config, model)
    ]


def predict_outputs(config: dict[str, Any]) -> list[str]:
    """One per-bar table per predicted model x new file (the `predict_all` target)."""
    return [
        paths.PREDICT.format(model=model, stem=stem)
        for model in predict_models(config)
        for stem in predict_files(config)
    ]
