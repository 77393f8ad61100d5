"""A preloaded parent for local daemons: import torch, hivemind and transformers once, fork every daemon.

Importing what a daemon needs takes seconds of CPU per process; a local swarm of nine daemons pays it
nine times on two cores. The zygote (``python -m gwtfp2p.localswarm.zygote FD``) imports it once, with
no thread started and no event loop, then forks one child per request read from its socket: the child
starts its own session, dies with the zygote (``PR_SET_PDEATHSIG``), takes the stdout and stderr sent
with the request (``SCM_RIGHTS``), its environment and directory, and runs ``gwtf join`` as a fresh
process would, or any module's main (``python -m MODULE`` with a pipe on its stdin: the tests' hostile
peer, which imports the same). The zygote reports each child's pid and, when it ends, its exit status.
``ZygoteClient`` is the parent's side; ``ForkedProcess`` looks like ``subprocess.Popen`` to callers.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import IO

JOIN_MODULE = "gwtf_cli.join_cmd"
PRELOAD = ("torch", "hivemind", "transformers", "uvloop", "typer", "gwtfp2p.daemon.lifecycle.node",
           "gwtfp2p.model.replica", JOIN_MODULE)
REAP_EVERY_S = 0.1
MAX_REQUEST_BYTES = 1 << 20
_PR_SET_PDEATHSIG = 1


# -- the zygote process ------------------------------------------------------------------------------
def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _exit_status(status: int) -> int:
    """As ``Popen.returncode``: the exit code, or minus the signal that ended the process."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _child(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: become a fresh daemon process and run ``gwtf join``; never returns."""
    code = 1
    try:
        conn.close()
        os.setsid()
        _die_with_parent()
        from gwtfp2p.dht.forking import own_hivemind_locks  # preloaded (``PRELOAD``): no import time here

        own_hivemind_locks()  # not the zygote's: a sibling killed holding one would wedge us (``dht/forking.py``)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd, target in zip(fds, (1, 2, 0), strict=False):  # stdout, stderr and, where sent, stdin
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        if request.get("cwd"):
            os.chdir(request["cwd"])
        args = [str(a) for a in request["args"]]
        code = _run_module(str(request["module"]), args) if request.get("module") else _run_join(args)
    except BaseException:  # the child must never return into the zygote's loop
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(ValueError, OSError):  # closed by what ran (python -m json.tool does)
                stream.flush()
        os._exit(code)


def _run_join(args: list[str]) -> int:
    """``gwtf join ARGS`` as its command line runs it (the command is looked up by module name, as
    ``python -m gwtf_cli.join_cmd`` would: the CLI sits above this package); its exit code."""
    import typer

    app = typer.Typer(add_completion=False)
    app.command()(importlib.import_module(JOIN_MODULE).join)
    sys.argv = ["gwtf join", *args]
    try:
        app(args=args, prog_name="gwtf join", standalone_mode=True)
    except SystemExit as e:
        return _exit_code(e)
    return 0


def _run_module(module: str, args: list[str]) -> int:
    """``python -m MODULE ARGS`` in this process; its exit code."""
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return _exit_code(e)
    return 0


def _exit_code(e: SystemExit) -> int:
    """As the interpreter ends on ``SystemExit``: an int is the code, None is 0, anything else is printed
    to stderr and gives 1."""
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=sys.stderr)
    return 1


def _receive(conn: socket.socket) -> tuple[dict, list[int]] | None:
    """One request (a JSON line) and the descriptors sent with it; None when the parent is gone."""
    data, fds, _flags, _addr = socket.recv_fds(conn, MAX_REQUEST_BYTES, 3)
    if not data:
        return None
    return json.loads(data), fds


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def serve(fd: int) -> None:
    """The zygote's loop: fork on each request, report pids and exits, until the parent closes."""
    conn = socket.socket(fileno=fd)
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([conn], [], [], REAP_EVERY_S)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            _send(conn, {"exit": pid, "code": _exit_status(status)})
        if not readable:
            continue
        received = _receive(conn)
        if received is None:
            return
        request, fds = received
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(conn, request, fds)
        for fd_ in fds:
            os.close(fd_)
        children.add(pid)
        _send(conn, {"pid": pid})


def main() -> None:
    _die_with_parent()
    for name in PRELOAD:
        importlib.import_module(name)
    serve(int(sys.argv[1]))


# -- the parent's side ---------------------------------------------------------------------------------
class ForkedProcess:
    """A daemon the zygote forked, with the ``subprocess.Popen`` interface local swarms use."""

    def __init__(self, pid: int, stdout: IO[bytes], stdin: IO[bytes] | None = None) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stdin = stdin
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout) or self.returncode is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return self.returncode


@dataclass
class _Pending:
    done: threading.Event
    pid: int = 0


class ZygoteClient:
    """Starts the zygote (from the calling thread: the zygote dies with it) and asks it for daemons."""

    def __init__(self, ready_timeout_s: float = 120.0) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn = ours
        self.process = subprocess.Popen([sys.executable, "-m", "gwtfp2p.localswarm.zygote", str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), preexec_fn=_die_with_parent)
        theirs.close()
        self.ready_timeout_s = ready_timeout_s
        self._children: dict[int, ForkedProcess] = {}
        self._early_exits: dict[int, int] = {}
        self._pending: _Pending | None = None
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True, name="gwtf-zygote-reader")
        self._reader.start()

    def spawn(self, args: list[str], stderr: IO[bytes], cwd: str | None, env: dict[str, str],
              module: str | None = None) -> ForkedProcess:
        """A daemon running ``gwtf join ARGS`` with this stderr, directory and environment; with ``module``,
        ``python -m MODULE ARGS`` instead, its stdin a pipe (``ForkedProcess.stdin``)."""
        read_end, write_end = os.pipe()
        stdin_read, stdin_write = os.pipe() if module else (-1, -1)
        pending = _Pending(threading.Event())
        with self._lock:
            self._pending = pending
        try:
            request = json.dumps({"args": args, "cwd": cwd, "env": env, "module": module}).encode()
            socket.send_fds(self.conn, [request], [write_end, stderr.fileno(), *([stdin_read] if module else [])])
        finally:
            os.close(write_end)
            if module:
                os.close(stdin_read)
        if not pending.done.wait(self.ready_timeout_s):
            os.close(read_end)
            if module:
                os.close(stdin_write)
            raise RuntimeError(f"the zygote did not fork within {self.ready_timeout_s:.0f} s "
                               f"(exit status {self.process.poll()})")
        child = ForkedProcess(pending.pid, os.fdopen(read_end, "rb"), os.fdopen(stdin_write, "wb") if module else None)
        with self._lock:
            self._children[pending.pid] = child
            if pending.pid in self._early_exits:
                child._exited(self._early_exits.pop(pending.pid))
        return child

    def _read(self) -> None:
        with self.conn.makefile("rb") as lines:
            for line in lines:
                message = json.loads(line)
                with self._lock:
                    if "pid" in message and self._pending is not None:
                        self._pending.pid = message["pid"]
                        self._pending.done.set()
                        self._pending = None
                    elif "exit" in message:
                        child = self._children.pop(message["exit"], None)
                        if child is None:
                            self._early_exits[message["exit"]] = message["code"]
                        else:
                            child._exited(message["code"])
        with self._lock:  # the zygote is gone, and its children with it
            for child in self._children.values():
                child._exited(-signal.SIGKILL)
            self._children.clear()

    def alive(self) -> bool:
        return self.process.poll() is None and self._reader.is_alive()

    def close(self) -> None:
        """Stop the zygote (it exits when its socket closes) and wait for it."""
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_RDWR)
        self.conn.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


if __name__ == "__main__":
    main()
