"""The local store's server keeper, run as a script of its own (`fxworker.store.local`
starts it, detached): ``python _local_server.py <server binary> <data dir> <socket> <idle s>``.

It runs the Redis-compatible server on the data directory (its append-only file there,
its unix socket the only way in) and keeps it until it has had no client for `idle s`:
then it shuts it down (the server writes its append-only file out first) and exits. A
SIGTERM shuts it down the same way. It outlives the process that started it, so a process
killed mid-turn leaves the server, and the session's journal, to the next process on the
directory. It imports only the standard library: it is on the path of a first prompt.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

POLL_S = 1.0
START_S = 60.0  # the longest a server may take to answer (loading a large file) before it is given up


class Connection:
    """One connection to the server, kept open (a process's hold on it, `local.Holder`)."""

    def __init__(self, path: str, timeout_s: float = 2.0) -> None:
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.settimeout(timeout_s)
        try:
            self._conn.connect(path)
        except OSError:
            self._conn.close()
            raise

    def ping(self) -> None:
        """PING, raising `OSError` unless the server answers it."""
        self._conn.sendall(b"*1\r\n$4\r\nPING\r\n")
        reply = self._conn.recv(64)
        if not reply:
            raise ConnectionResetError("the local store's server closed the connection")
        if not reply.startswith((b"+PONG", b"-LOADING")):
            raise ConnectionError(f"the local store's server answered {reply[:40]!r}")

    def close(self) -> None:
        self._conn.close()


def command(path: str, *args: str, timeout_s: float = 2.0) -> bytes:
    """One command over the unix socket; the raw reply (RESP), read until it is whole enough
    for what this script asks (a status line, or a bulk string)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        conn.connect(path)
        conn.sendall(b"".join([f"*{len(args)}\r\n".encode(), *(f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args)]))
        reply = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return reply
            reply += chunk
            if reply.startswith((b"+", b"-", b":")) and reply.endswith(b"\r\n"):
                return reply
            if reply.startswith(b"$"):
                head, _, rest = reply.partition(b"\r\n")
                if int(head[1:]) < 0 or len(rest) >= int(head[1:]) + 2:
                    return reply


def clients(path: str) -> int:
    """Connected clients besides the one asking."""
    info = command(path, "INFO", "clients").decode(errors="replace")
    for line in info.splitlines():
        if line.startswith("connected_clients:"):
            return int(line.split(":", 1)[1]) - 1
    return 0


def main(binary: str, data_dir: str, sock: str, idle_s: float) -> int:
    server = subprocess.Popen(
        [binary, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--dir", data_dir,
         "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--maxmemory-policy", "noeviction",
         "--daemonize", "no", "--logfile", os.path.join(data_dir, "server.log")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    idle_since: float | None = None
    started = time.monotonic()
    while server.poll() is None and not stopping:  # until it answers (a large file loads a while)
        try:
            if command(sock, "PING").startswith(b"+PONG"):
                break
        except OSError:
            pass
        if time.monotonic() - started > START_S:
            stopping = True
        time.sleep(0.02)
    while server.poll() is None and not stopping:
        time.sleep(POLL_S)
        try:
            busy = clients(sock) > 0
        except OSError:
            break  # it answered before: a socket gone (its directory deleted) or refused serves no one
        now = time.monotonic()
        idle_since = None if busy else (idle_since or now)
        if idle_since is not None and now - idle_since >= idle_s:
            break
    if server.poll() is None:
        if not os.path.isdir(data_dir):
            server.kill()  # its directory is gone: nothing of it can be kept, and it could not write it out
        else:
            try:
                reply = command(sock, "SHUTDOWN", timeout_s=30)  # the file written out first
            except OSError:
                reply = b"-unreachable"
            if reply.startswith(b"-"):
                server.terminate()  # SIGTERM: the same, by signal
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    return server.returncode or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
