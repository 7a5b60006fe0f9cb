"""A throwaway PostgreSQL cluster for tests and benchmarks: `initdb` + `pg_ctl` on a free loopback port.

    python -m tests.postgres.cluster start DIR   # prints the superuser URL (password auth on 127.0.0.1)
    python -m tests.postgres.cluster stop DIR

The cluster lives in DIR (a fresh temp dir), listens only on 127.0.0.1 and on a socket inside DIR, and requires a
password (scram-sha-256), so wrong-password errors are real. As root (CI) the server runs as the `postgres` user
via `runuser`, since PostgreSQL refuses to run as root. `unavailable()` says why a cluster cannot be started here.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

USER = "marketrl"
SERVER_USER = "postgres"  # the Debian package's system user, used when running as root
START_TIMEOUT_S = 60


def _bin_dir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return versions[-1].parent if versions else None


def unavailable() -> str:
    """Why no cluster can be started here ('' when one can)."""
    if _bin_dir() is None:
        return "PostgreSQL is not installed (no initdb on PATH or under /usr/lib/postgresql; apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            subprocess.run(["id", "-u", SERVER_USER], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            return f"running as root but there is no '{SERVER_USER}' user to run the server as"
        if shutil.which("runuser") is None:
            return "running as root but runuser is missing"
    try:
        import psycopg2  # noqa: F401
    except ModuleNotFoundError:
        return "psycopg2 is missing: pip install -c requirements.lock -e '.[postgres]'"
    return ""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class Cluster:
    """A running cluster: its directory, port and the superuser's password."""

    directory: Path
    port: int
    password: str

    def url(self, database: str = "postgres", password: str | None = None) -> str:
        """A SQLAlchemy URL for `database` (with another `password` to test a wrong one)."""
        secret = self.password if password is None else password
        return f"postgresql://{USER}:{secret}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create an empty database; return its URL."""
        import psycopg2

        connection = psycopg2.connect(self.url())
        connection.autocommit = True  # CREATE DATABASE cannot run inside a transaction
        try:
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()
        return self.url(name)


def _run_as_server_user(command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    if os.geteuid() == 0:
        command = ["runuser", "-u", SERVER_USER, "--", *command]
    return subprocess.run(command, check=True, capture_output=True, text=True, **kwargs)  # type: ignore[arg-type]


def start(directory: str | Path) -> Cluster:
    """initdb a new cluster in `directory` (created, must not exist or be empty) and start it."""
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    bins = _bin_dir()
    assert bins is not None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    password = secrets.token_hex(12)
    (directory / "pwfile").write_text(password + "\n")
    if os.geteuid() == 0:
        shutil.chown(directory, SERVER_USER)
        shutil.chown(directory / "pwfile", SERVER_USER)
    port = _free_port()
    data = directory / "data"
    try:
        _run_as_server_user(
            [
                str(bins / "initdb"),
                "-D",
                str(data),
                "-U",
                USER,
                "--pwfile",
                str(directory / "pwfile"),
                "--auth-local=scram-sha-256",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            timeout=START_TIMEOUT_S,
        )
        options = f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60"
        _run_as_server_user(
            [
                str(bins / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(directory / "server.log"),
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "start",
            ],
            timeout=START_TIMEOUT_S + 10,
        )
    except subprocess.CalledProcessError as exc:
        log = directory / "server.log"
        detail = log.read_text()[-2000:] if log.exists() else ""
        raise RuntimeError(
            f"could not start PostgreSQL in {directory}: {exc.stderr.strip()}\n{detail}"
        ) from exc
    (directory / "port").write_text(str(port))
    return Cluster(directory, port, password)


def stop(directory: str | Path) -> None:
    """Stop the cluster in `directory` (immediate shutdown: it is thrown away)."""
    bins = _bin_dir()
    data = Path(directory) / "data"
    if bins is None or not (data / "postmaster.pid").exists():
        return
    _run_as_server_user([str(bins / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], timeout=60)


def main(argv: list[str]) -> int:
    """CLI: start DIR prints the URL; stop DIR."""
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "start":
        print(start(argv[1]).url())
    else:
        stop(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
