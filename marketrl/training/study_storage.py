"""Where a hyperopt study lives and how its workers share it: storage, trial claims, dead-worker recovery.

One claim protocol (`work_on_study`) over two backends:

- **Journal file** (default): `results/hyperopt/{model}/journal.log`. Claims run under a `flock` on
  `study.lock`; a RUNNING trial whose owner process on this host is gone is recovered at the next claim.
- **PostgreSQL** (`hyperopt.storage` or `MARKETRL_OPTUNA_STORAGE` = `postgresql://...`): Optuna's RDBStorage.
  Claims run under a transaction-level advisory lock of the study, so workers on any number of hosts need no
  shared file. Every running trial has a row in `marketrl_trial_heartbeats` that a thread of its worker refreshes
  every `hyperopt.heartbeat_seconds`; a RUNNING trial whose row is older than `hyperopt.grace_seconds` (database
  clock) is recovered by whichever worker claims next, on any host. A worker with nothing left to claim waits while
  other workers' trials run, so a crash near the end is still re-run and the study finishes.

Recovery marks the trial `interrupted`, fails it and re-enqueues it with its slot (and its parameters once all were
drawn): interrupted trials never count, so a study always ends with exactly `n_trials` counted trials, the same
slots, seeds and parameters as one uninterrupted worker (docs/HYPEROPT.md).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError

from gpu_utils import NonFiniteError
from marketrl.runtime.provenance import redact_url
from marketrl.settings import paths
from marketrl.settings.config import derive_seed

log = logging.getLogger(__name__)

STORAGE_ENV = "MARKETRL_OPTUNA_STORAGE"  # wins over hyperopt.storage when set and non-empty
STORAGE_KEY = "hyperopt.storage"
INTERRUPTED = "interrupted"
OWNER = "owner"
SLOT = "slot"  # the trial's place 0..n_trials-1 in the study; its sampler and training seeds derive from it
SAMPLED = "params_sampled"  # False from the claim until the objective has suggested every parameter
HEARTBEATS_TABLE = "marketrl_trial_heartbeats"
CONNECT_TIMEOUT_S = 10


class HyperoptError(ValueError):
    """A study cannot run or be summarized (no completed trial, wrong trial count, bad storage)."""


# ------------------------------------------------------------------------------------------------------ storage


def storage_url(config: Mapping[str, Any]) -> str:
    """The study storage URL: $MARKETRL_OPTUNA_STORAGE when set, else hyperopt.storage ('' = journal file)."""
    return (os.environ.get(STORAGE_ENV, "").strip() or config["hyperopt"]["storage"]).strip()


def storage_label(config: Mapping[str, Any], model: str, results_dir: str | Path = "results") -> str:
    """Where the study lives, safe to log and to write into outputs (the URL without its password)."""
    url = storage_url(config)
    return redact_url(url) if url else str(study_dir(model, results_dir) / "journal.log")


def is_postgres(url: str) -> bool:
    """True for postgresql:// and postgresql+driver:// URLs."""
    return url.split("://", 1)[0].split("+", 1)[0] in ("postgresql", "postgres")


def _key_name() -> str:
    source = f" (from ${STORAGE_ENV})" if os.environ.get(STORAGE_ENV, "").strip() else ""
    return f"config key '{STORAGE_KEY}'{source}"


def storage_error(url: str, exc: BaseException) -> HyperoptError:
    """A one-line error naming the config key and the URL without its password."""
    if isinstance(exc, ModuleNotFoundError) and is_postgres(url):
        return HyperoptError(
            f"{_key_name()}: {redact_url(url)} needs the PostgreSQL driver ({exc}); "
            "install it with pip install -c requirements.lock -e '.[postgres]'"
        )
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    password = _password(url)
    if password:
        message = message.replace(password, "***")
    return HyperoptError(f"{_key_name()}: cannot open {redact_url(url)}: {message}")


def _password(url: str) -> str:
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception:  # an unparsable URL: SQLAlchemy reports it when opening
        return ""
    return parsed.password or str(parsed.query.get("password", "") or "")


def engine_kwargs(url: str) -> dict[str, Any]:
    """SQLAlchemy engine options: for PostgreSQL a connect timeout (unless the URL sets one) and a pool check."""
    if not is_postgres(url):
        return {}
    connect_args: dict[str, Any] = {"application_name": "marketrl-hyperopt"}
    if "connect_timeout=" not in url:
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    return {"pool_pre_ping": True, "connect_args": connect_args}


@contextmanager
def _schema_lock(url: str) -> Iterator[None]:
    """On PostgreSQL, one worker at a time creates Optuna's tables (concurrent CREATE TABLEs of a fresh database
    collide); a session advisory lock, released with the connection."""
    if not is_postgres(url):
        yield
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool, **engine_kwargs(url))
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _advisory_key("optuna-schema")})
            connection.commit()
            yield
    finally:
        engine.dispose()


def _advisory_key(name: str) -> int:
    digest = hashlib.sha256(f"marketrl-hyperopt:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)  # advisory locks take a bigint


def study_dir(model: str, results_dir: str | Path = "results") -> Path:
    """Where a model's study keeps its journal and lock file (marketrl.settings.paths.STUDY_DIR under `results_dir`)."""
    return Path(results_dir) / paths.STUDY_SUBDIR.format(model=model)


def open_storage(config: Mapping[str, Any], model: str, results_dir: str | Path = "results") -> Any:
    """The study storage: an RDB URL ($MARKETRL_OPTUNA_STORAGE or hyperopt.storage), else a JournalFileStorage
    under results/hyperopt/{model}/."""
    url = storage_url(config)
    if url:
        try:
            with _schema_lock(url):
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url))
        except Exception as exc:  # SQLAlchemy and the drivers raise many types; the user needs the key
            raise storage_error(url, exc) from None
    directory = study_dir(model, results_dir)
    directory.mkdir(parents=True, exist_ok=True)
    backend = optuna.storages.journal.JournalFileBackend(
        str(directory / "journal.log"), lock_obj=JournalFlock(directory / "journal.lock")
    )
    return optuna.storages.JournalStorage(backend)


class JournalFlock:
    """The journal's write lock as a kernel file lock (flock), which dies with the process holding it.

    Optuna's default symlink lock outlives a worker killed mid-write: the next worker waits for a grace period,
    and forever when the journal path is relative (the lock's symlink then dangles, so its age is never read).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._handle: Any = None

    def acquire(self) -> bool:
        """Block until this process holds the lock."""
        handle = open(self.path, "a+")  # stays open while the lock is held
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        self._handle = handle
        return True

    def release(self) -> None:
        """Release the lock."""
        handle, self._handle = self._handle, None
        if handle is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            handle.close()


@contextmanager
def study_lock(model: str, results_dir: str | Path = "results") -> Iterator[None]:
    """An exclusive lock shared by every worker of the study (a file lock on the shared filesystem)."""
    path = study_dir(model, results_dir) / "study.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# ------------------------------------------------------------------------------------------------------- claims


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _owner_is_dead(owner: str) -> bool:
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's worker: only its own restart can tell
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def counted_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that count towards n_trials: everything except interrupted ones (whose params were re-enqueued)."""
    return [t for t in study.get_trials(deepcopy=False) if not t.user_attrs.get(INTERRUPTED)]


def slot_sampler_seed(seed: int, slot: int) -> int:
    """The TPE sampler seed of one trial slot, from the study's sampler seed root."""
    return derive_seed(seed, SLOT, slot)


def _waiting(trials: Sequence[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    return [t for t in trials if t.state == optuna.trial.TrialState.WAITING]


def interrupt_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
    """Mark a RUNNING trial interrupted, fail it and re-enqueue its slot; False if it finished meanwhile."""
    try:
        # Marked before it is failed: a recoverer dying in between leaves a trial that no longer counts, so its
        # slot is free again and is claimed afresh (same slot, same seeds).
        study._storage.set_trial_user_attr(trial._trial_id, INTERRUPTED, True)
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
    except (UpdateFinishedTrialError, ValueError):
        return False  # its worker told it first; if it was marked, the slot simply runs again
    # The rerun keeps the trial's slot, hence its seeds, and its parameters once they were all drawn (a partial
    # set would shift the slot's sampler draws): the study ends as if it was never interrupted.
    slot = {SLOT: trial.user_attrs[SLOT]} if SLOT in trial.user_attrs else None
    params = trial.params if trial.user_attrs.get(SAMPLED, True) else {}
    study.enqueue_trial(params, user_attrs=slot, skip_if_exists=False)
    return True


def recover_interrupted(study: optuna.Study) -> int:
    """Fail RUNNING trials whose worker on this host is gone, and re-enqueue their parameters; return the count.

    Call under the claim lock. A RUNNING trial with no owner was then left by a claimer killed between `ask()` and
    recording its owner (a live claimer holds the lock until both are written), so it is dead too.
    """
    recovered = 0
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        owner = trial.user_attrs.get(OWNER, "")
        if not owner or _owner_is_dead(owner):
            recovered += interrupt_trial(study, trial)
    return recovered


def make_sampler(seed: int | None, fixed: Mapping[str, Any] | None = None) -> optuna.samplers.BaseSampler:
    """The studies' sampler: TPE seeded with `seed`; with `fixed` (the model's hyperopt.fixed), those parameters
    pinned in every trial (Optuna's PartialFixedSampler around the TPE)."""
    sampler = optuna.samplers.TPESampler(seed=seed)
    if not fixed:
        return sampler
    with warnings.catch_warnings():  # "experimental since v2.4.0": its interface, not our results, may change
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.PartialFixedSampler(dict(fixed), sampler)


def claim_trial(
    study: optuna.Study,
    n_trials: int,
    *,
    seed: int | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> optuna.Trial | None:
    """Start the next trial (a re-enqueued one first) unless the study already holds n_trials; call under the
    claims' lock (`study_lock` for a journal).

    Every trial gets a slot (0..n_trials-1, kept by a re-enqueued trial). With `seed`, the sampler is reseeded
    per slot, so the parameters a slot draws do not depend on which worker process claims it or on restarts;
    `fixed` keeps the model's pinned parameters (hyperopt.fixed) in the reseeded sampler.
    """
    counted = counted_trials(study)
    waiting = _waiting(counted)
    if len(counted) - len(waiting) >= n_trials:
        return None
    free = sorted(set(range(n_trials)) - {t.user_attrs.get(SLOT) for t in counted})
    slot = free[0] if free else len(counted)
    if waiting:  # ask() pops the oldest waiting (re-enqueued) trial, which keeps its slot
        slot = waiting[0].user_attrs.get(SLOT, slot)
    if seed is not None:
        study.sampler = make_sampler(slot_sampler_seed(seed, slot), fixed)
    trial = study.ask()
    if SLOT not in trial.user_attrs:
        trial.set_user_attr(SLOT, slot)
    trial.set_user_attr(SAMPLED, False)
    trial.set_user_attr(OWNER, _owner())
    return trial


class TrialClaims:
    """How the workers of one study exclude each other while claiming, and find trials of dead workers.

    The default (journal file): a `flock` on results/hyperopt/{model}/study.lock, and a RUNNING trial counts as dead
    when its owner process on this host is gone. Trials of other hosts are never judged, and nobody waits for them.
    """

    def __init__(self, model: str, results_dir: str | Path = "results") -> None:
        self.model = model
        self.results_dir = results_dir

    def lock(self, study: optuna.Study) -> AbstractContextManager[None]:
        """Held while recovering and claiming."""
        return study_lock(self.model, self.results_dir)

    def recover(self, study: optuna.Study) -> int:
        """Interrupt and re-enqueue the trials of dead workers (under the lock); return how many."""
        return recover_interrupted(study)

    def started(self, study: optuna.Study, trial: optuna.Trial) -> None:
        """Called under the lock right after `trial` was claimed."""

    def beating(self, study: optuna.Study, trial: optuna.Trial) -> AbstractContextManager[None]:
        """Held while the objective runs `trial`."""
        return nullcontext()

    def finished(self, study: optuna.Study, trial: optuna.Trial) -> None:
        """Called after `trial` was told."""

    def taken_over(self, study: optuna.Study, trial: optuna.Trial) -> bool:
        """Whether another worker recovered `trial` while this one still ran it."""
        return False

    def wait_for_others(self, study: optuna.Study) -> bool:
        """With nothing left to claim: wait if other workers' trials may still need a rerun (then True)."""
        return False


class PostgresClaims(TrialClaims):
    """Claims in PostgreSQL: an advisory lock per study, and heartbeat rows judged by the database's clock.

    Optuna's own heartbeat (RDBStorage(heartbeat_interval, grace_period) with fail_stale_trials) runs only inside
    study.optimize() and fails a stale trial before its callback may re-enqueue it; here the trial is marked
    interrupted first, under the claim lock, so a recoverer's crash cannot turn an interruption into a counted FAIL.
    """

    def __init__(self, url: str, *, heartbeat_seconds: float, grace_seconds: float) -> None:
        super().__init__("")
        from sqlalchemy import create_engine

        self.url = url
        self.heartbeat_seconds = heartbeat_seconds
        self.grace_seconds = grace_seconds
        self.owner = _owner()
        self._engine = create_engine(url, **engine_kwargs(url))
        self._connection: Any = None
        self._table_ready = False

    def _execute(self, sql: str, **params: Any) -> Any:
        from sqlalchemy import text

        return self._connection.execute(text(sql), params)

    @contextmanager
    def lock(self, study: optuna.Study) -> Iterator[None]:
        """A transaction holding the study's advisory lock; PostgreSQL drops it when a killed worker's
        connection closes, so no lock outlives its holder."""
        try:
            connection = self._engine.connect()
        except Exception as exc:
            raise storage_error(self.url, exc) from None
        with connection, connection.begin():
            self._connection = connection
            try:
                self._execute("SELECT pg_advisory_xact_lock(:key)", key=_advisory_key(study.study_name))
                if not self._table_ready:  # under the lock: concurrent CREATE TABLE IF NOT EXISTS can collide
                    self._execute(
                        f"CREATE TABLE IF NOT EXISTS {HEARTBEATS_TABLE} (study_name TEXT NOT NULL, "
                        "number INTEGER NOT NULL, owner TEXT NOT NULL, beat_at TIMESTAMPTZ NOT NULL DEFAULT now(), "
                        "PRIMARY KEY (study_name, number))"
                    )
                    self._table_ready = True
                yield
            finally:
                self._connection = None

    def recover(self, study: optuna.Study) -> int:
        """Interrupt RUNNING trials without a heartbeat younger than the grace period (any host)."""
        # Heartbeat rows first, trials second: a trial still RUNNING at the second read had its row at the first
        # (rows are written under this lock and dropped only after the trial is told), so a trial finishing
        # between the two reads is never mistaken for a dead one.
        rows = self._execute(
            f"SELECT number, now() - beat_at <= make_interval(secs => :grace) AS fresh FROM {HEARTBEATS_TABLE} "
            "WHERE study_name = :study",
            grace=float(self.grace_seconds),
            study=study.study_name,
        ).all()
        running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        fresh = {number for number, is_fresh in rows if is_fresh}
        recovered = 0
        for trial in running:
            if trial.number not in fresh and interrupt_trial(study, trial):
                recovered += 1
                log.warning(
                    "trial %d (slot %s, worker %s) had no heartbeat for %.0f s: interrupted, its slot runs again",
                    trial.number,
                    trial.user_attrs.get(SLOT),
                    trial.user_attrs.get(OWNER, "?"),
                    self.grace_seconds,
                )
        running_numbers = {t.number for t in running}
        dropped = [number for number, is_fresh in rows if not is_fresh and number not in running_numbers]
        dropped += [t.number for t in running if t.number not in fresh]
        if dropped:  # rows of recovered trials, and of workers that died between telling and dropping them
            self._execute(
                f"DELETE FROM {HEARTBEATS_TABLE} WHERE study_name = :study AND number = ANY(:numbers)",
                study=study.study_name,
                numbers=sorted(set(dropped)),
            )
        return recovered

    def started(self, study: optuna.Study, trial: optuna.Trial) -> None:
        """The trial's first heartbeat, committed with the claim."""
        self._execute(
            f"INSERT INTO {HEARTBEATS_TABLE} (study_name, number, owner) VALUES (:study, :number, :owner) "
            "ON CONFLICT (study_name, number) DO UPDATE SET owner = EXCLUDED.owner, beat_at = now()",
            study=study.study_name,
            number=trial.number,
            owner=self.owner,
        )

    def _beat(self, study_name: str, number: int) -> bool:
        from sqlalchemy import text

        with self._engine.begin() as connection:
            result = connection.execute(
                text(
                    f"UPDATE {HEARTBEATS_TABLE} SET beat_at = now() "
                    "WHERE study_name = :study AND number = :number AND owner = :owner"
                ),
                {"study": study_name, "number": number, "owner": self.owner},
            )
        return result.rowcount == 1

    @contextmanager
    def beating(self, study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
        """A daemon thread refreshes the trial's heartbeat every heartbeat_seconds while the objective runs."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat_seconds):
                try:
                    if not self._beat(study.study_name, trial.number):
                        log.warning(
                            "trial %d was recovered by another worker; heartbeat stopped", trial.number
                        )
                        return
                except Exception as exc:  # a lost connection may come back before the grace period ends
                    log.warning("heartbeat of trial %d failed: %s", trial.number, str(exc).splitlines()[0])

        thread = threading.Thread(target=beat, name=f"heartbeat-trial-{trial.number}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def finished(self, study: optuna.Study, trial: optuna.Trial) -> None:
        """Drop the trial's heartbeat row."""
        from sqlalchemy import text

        with self._engine.begin() as connection:
            connection.execute(
                text(
                    f"DELETE FROM {HEARTBEATS_TABLE} WHERE study_name = :study AND number = :number "
                    "AND owner = :owner"
                ),
                {"study": study.study_name, "number": trial.number, "owner": self.owner},
            )

    def taken_over(self, study: optuna.Study, trial: optuna.Trial) -> bool:
        """True when the trial's heartbeat row is no longer this worker's (a recoverer deleted it)."""
        from sqlalchemy import text

        with self._engine.connect() as connection:
            owner = connection.execute(
                text(f"SELECT owner FROM {HEARTBEATS_TABLE} WHERE study_name = :study AND number = :number"),
                {"study": study.study_name, "number": trial.number},
            ).scalar()
        return owner != self.owner

    def wait_for_others(self, study: optuna.Study) -> bool:
        """While another worker's trial runs, wait one heartbeat period: it may die and need a rerun."""
        if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            return False
        time.sleep(self.heartbeat_seconds)  # a poll interval, not a wait for an event we could be told of
        return True


def trial_claims(config: Mapping[str, Any], model: str, results_dir: str | Path = "results") -> TrialClaims:
    """The claims of the configured storage: PostgreSQL claims for a postgresql:// URL, else the file lock."""
    url = storage_url(config)
    if url and is_postgres(url):
        hyperopt = config["hyperopt"]
        return PostgresClaims(
            url, heartbeat_seconds=hyperopt["heartbeat_seconds"], grace_seconds=hyperopt["grace_seconds"]
        )
    return TrialClaims(model, results_dir)


# ----------------------------------------------------------------------------------------------------- the loop


def work_on_study(
    study: optuna.Study,
    model: str,
    n_trials: int,
    objective: Callable[[optuna.Trial], float],
    results_dir: str | Path = "results",
    *,
    seed: int | None = None,
    claims: TrialClaims | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> list[int]:
    """Claim and run trials until the study holds `n_trials` (shared with other workers); return this worker's.

    `seed`: reseed the sampler per trial slot (see `claim_trial`). `claims`: how workers exclude each other and
    recover dead workers' trials (`trial_claims`); default the journal's file lock under `results_dir`. `fixed`:
    the model's pinned parameters (hyperopt.fixed).
    """
    claims = claims or TrialClaims(model, results_dir)
    ran: list[int] = []
    while True:
        with claims.lock(study):
            recovered = claims.recover(study)
            trial = claim_trial(study, n_trials, seed=seed, fixed=fixed)
            if trial is not None:
                claims.started(study, trial)
        if recovered:
            log.warning("re-enqueued %d trial(s) interrupted by a killed worker", recovered)
        if trial is None:
            if claims.wait_for_others(study):
                continue
            return ran
        try:
            with claims.beating(study, trial):
                value = objective(trial)
        except optuna.TrialPruned as exc:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)
            log.info("trial %d pruned: %s", trial.number, exc)
        except NonFiniteError as exc:
            trial.set_user_attr("pruned_reason", str(exc).splitlines()[0])
            study.tell(trial, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)
            log.warning("trial %d diverged and was pruned: %s", trial.number, exc)
        except BaseException as exc:
            if isinstance(exc, UpdateFinishedTrialError) and claims.taken_over(study, trial):
                log.warning(
                    "trial %d was re-run by another worker (heartbeat lapsed); dropped here", trial.number
                )
                continue
            study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            claims.finished(study, trial)
            raise
        else:
            if claims.taken_over(study, trial):
                log.warning(
                    "trial %d was re-run by another worker (heartbeat lapsed); dropped here", trial.number
                )
                continue
            study.tell(trial, value, skip_if_finished=True)
            log.info("trial %d: validation Sharpe %.3f", trial.number, value)
        claims.finished(study, trial)
        ran.append(trial.number)
