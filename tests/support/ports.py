"""The web commands' default port held busy, as another server on the machine would hold it.

`fx web`, `fx dev` and `fx demo` listen on 8000 unless told otherwise, and check that the
port is free before anything else. A test that starts one without `--port` so fails (or
passes) depending on what else runs on the machine; `default_port_busy` makes that failure
certain, so such a test is caught wherever the suite runs.

    python -m tests.support.ports [PORT]   # holds the port until killed (to run a test by hand)
"""

from __future__ import annotations

import contextlib
import errno
import signal
import socket
import sys
from collections.abc import Iterator

import pytest

DEFAULT_WEB_PORT = 8000  # fxworker/settings.py `port`, the `--port` default of fx dev and fx demo


@contextlib.contextmanager
def hold_port(port: int = DEFAULT_WEB_PORT) -> Iterator[None]:
    """Keeps `port` listening on every IPv4 address (which takes 127.0.0.1 too) for the block.

    A port another process already holds stays busy without us: that is the same state.
    """
    held: list[socket.socket] = []
    for host in ("0.0.0.0", "127.0.0.1"):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((host, port))
            sock.listen()  # a bound socket that does not listen yields to SO_REUSEADDR binds
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            continue
        held.append(sock)
        break  # 0.0.0.0 covers 127.0.0.1; the loopback bind is the fallback when 0.0.0.0 is refused
    try:
        yield
    finally:
        for sock in held:
            sock.close()


@pytest.fixture(scope="module")
def default_port_busy() -> Iterator[int]:
    """Port 8000 busy for a module's tests: a command that would bind it must be given `--port`."""
    with hold_port(DEFAULT_WEB_PORT):
        yield DEFAULT_WEB_PORT


if __name__ == "__main__":
    with hold_port(int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_WEB_PORT):
        print("held", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
