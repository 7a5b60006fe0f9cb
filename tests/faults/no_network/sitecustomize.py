"""Blocks every non-unix socket connection in any Python process that starts with this directory on PYTHONPATH.

Used by tests/test_security.py to prove the demo pipeline needs no network. Unix sockets and pipes (which a
local Snakemake run may use) keep working. Every process that loads the blocker appends an "armed" line to
$MARKETRL_NETWORK_LOG (with its command line and whether DATABENTO_API_KEY is set, never the key itself), and
every blocked attempt a "blocked" line, so a test can tell "made no connection" from "tried one and swallowed the
error" and check that the job processes really ran with the blocker.
"""

import os
import socket
import sys

_LOG = os.environ.get("MARKETRL_NETWORK_LOG", "")


class NetworkBlockedError(OSError):
    """A test forbade network access."""


def _note(line: str) -> None:
    if _LOG:
        with open(_LOG, "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} {line}\n")


def _refuse(what: str, target: object) -> None:
    _note(f"blocked {what} {target!r}")
    raise NetworkBlockedError(f"network access blocked by the test: {what} {target!r}")


_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex
_sendto = socket.socket.sendto


def _guarded_connect(self: socket.socket, address: object) -> None:
    if self.family != getattr(socket, "AF_UNIX", None):
        _refuse("connect", address)
    return _connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: object) -> int:
    if self.family != getattr(socket, "AF_UNIX", None):
        _refuse("connect_ex", address)
    return _connect_ex(self, address)


def _guarded_sendto(self: socket.socket, *args: object) -> int:
    if self.family != getattr(socket, "AF_UNIX", None):
        _refuse("sendto", args[-1])
    return _sendto(self, *args)


def _guarded_getaddrinfo(host: object, *args: object, **kwargs: object) -> list:
    _refuse("getaddrinfo", host)
    return []


socket.socket.connect = _guarded_connect
socket.socket.connect_ex = _guarded_connect_ex
socket.socket.sendto = _guarded_sendto
socket.getaddrinfo = _guarded_getaddrinfo
socket.create_connection = lambda address, *args, **kwargs: _refuse("create_connection", address)

_note(f"armed key_set={'DATABENTO_API_KEY' in os.environ} argv={' '.join(getattr(sys, 'argv', []))}")
