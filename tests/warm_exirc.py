"""`python -m exirc ARGS` in a new process forked from a warm one.

A CLI test's process spends about 2 s of CPU importing torch and the
compiler before `main` runs; the suite starts about 200 of them. Here one
server per test process imports them once (torch, the compiler, the
runtime: never a kernel run, so no OpenMP pool is forked) and forks a child
per command. The child is a process of its own in every way a command sees:
its stdin, stdout and stderr are pipes (or /dev/null), its working
directory, environment, `sys.argv` and resource limits are the command's,
its exit code (or signal) is the test's, its `atexit` handlers run, and a
command that never ends is killed at `timeout`. It runs `exirc.cli.app.main`,
what `python -m exirc` and the `exirc` script run.

What it cannot show is a fresh interpreter's start: which modules a command
imports, how long that takes, what a third-party import prints. The tests of
those (`tests/cli/test_start_up.py`, `tests/runtime/core/test_load_imports.py`,
the console script's) start real processes, and so does any command whose
environment differs from the server's in what a process reads at its start
(`PYTHON*`, `LD_*`, `OMP_*`, `MKL_*`, `TORCH*`). EXIRC_TEST_REAL_PROCESSES=1
makes every command a real process.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# What the server imports before its first fork: the heavy imports of every
# command, not the optional packages whose import-time output or settings a
# test may look at (torchao, transformers, ExecuTorch: a child imports those).
WARM_MODULES = ("numpy", "torch", "torch.export", "torch._dynamo", "sympy", "click",
                "exirc.cli.app", "exirc.compiler", "exirc.capture", "exirc.runtime",
                "exirc.inspector")
_READ_AT_START = ("PYTHON", "LD_", "OMP_", "MKL_", "TORCH")
_HEADER = struct.Struct("!Q")


def exirc(args: Sequence[str], *, cwd: str | Path | None = None,
          env: Mapping[str, str] | None = None, input: bytes | str | None = None,
          timeout: float, text: bool = False, file_size_limit: int | None = None,
          real: bool = False) -> subprocess.CompletedProcess[Any]:
    """Like `subprocess.run([python, "-m", "exirc", *args], capture_output=True,
    ...)`: raises subprocess.TimeoutExpired after `timeout` (the child killed).
    `real`: a fresh `python -m exirc` process, whatever the environment."""
    command = [sys.executable, "-m", "exirc", *map(str, args)]
    environment = dict(os.environ if env is None else env)
    environment["PYTHONPATH"] = _with_repo(environment.get("PYTHONPATH"))
    data = input.encode() if isinstance(input, str) else input
    server = None if real else _server()
    if server is None or not server.can_run(environment):
        done = subprocess.run(command, input=data, capture_output=True, cwd=cwd,
                              env=environment, timeout=timeout, stdin=None if data is not None
                              else subprocess.DEVNULL, preexec_fn=_limiter(file_size_limit))
    else:
        try:
            done = server.run(command, cwd=str(cwd or os.getcwd()), env=environment,
                              input=data, timeout=timeout, file_size_limit=file_size_limit)
        except ServerGone:  # before the command started: run it for real instead
            return exirc(args, cwd=cwd, env=env, input=input, timeout=timeout, text=text,
                         file_size_limit=file_size_limit, real=True)
    if text:
        return subprocess.CompletedProcess(done.args, done.returncode,
                                           done.stdout.decode(errors="replace"),
                                           done.stderr.decode(errors="replace"))
    return done


def _with_repo(path: str | None) -> str:
    """PYTHONPATH with this checkout first, so the command runs its code."""
    parts = [str(REPO), *[p for p in (path or "").split(os.pathsep) if p and p != str(REPO)]]
    return os.pathsep.join(parts)


def _limiter(file_size_limit: int | None) -> Any:
    if file_size_limit is None:
        return None

    def limit() -> None:
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
    return limit


class ServerGone(Exception):
    """The warm server went away before it started a command."""


class _Server:
    """The client's side of one warm server process."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.environment = {**os.environ, "PYTHONPATH": _with_repo(os.environ.get("PYTHONPATH"))}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.warm_exirc", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], cwd=REPO, env=self.environment,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        theirs.close()
        self.socket = ours

    def can_run(self, environment: Mapping[str, str]) -> bool:
        """Whether a command with `environment` starts as the server did."""
        if self.process.poll() is not None:
            return False
        keys = {k for k in (*environment, *self.environment) if k.startswith(_READ_AT_START)}
        return all(environment.get(k) == self.environment.get(k) for k in keys)

    def run(self, command: list[str], *, cwd: str, env: dict[str, str], input: bytes | None,
            timeout: float, file_size_limit: int | None) -> subprocess.CompletedProcess[bytes]:
        stdin_read, stdin_write = os.pipe() if input is not None else (
            os.open(os.devnull, os.O_RDONLY), -1)
        stdout_read, stdout_write = os.pipe()
        stderr_read, stderr_write = os.pipe()
        request = json.dumps({"argv": command[3:], "cwd": cwd, "env": env,
                              "file_size_limit": file_size_limit}).encode()
        try:
            socket.send_fds(self.socket, [_HEADER.pack(len(request))],
                            [stdin_read, stdout_write, stderr_write])
            self.socket.sendall(request)
            for fd in (stdin_read, stdout_write, stderr_write):
                os.close(fd)
            pid = int(_read_message(self.socket)["pid"])
        except OSError as error:  # the server is gone (ConnectionError is an OSError)
            for fd in (stdin_read, stdout_write, stderr_write, stdin_write, stdout_read,
                       stderr_read):
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise ServerGone from error
        try:
            stdout, stderr = _communicate(stdin_write, stdout_read, stderr_read, input,
                                          time.monotonic() + timeout)
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            _read_message(self.socket)
            raise subprocess.TimeoutExpired(command, timeout) from None
        status = int(_read_message(self.socket)["status"])
        return subprocess.CompletedProcess(command, os.waitstatus_to_exitcode(status),
                                           stdout, stderr)


def _communicate(stdin: int, stdout: int, stderr: int, data: bytes | None,
                 deadline: float) -> tuple[bytes, bytes]:
    """Write `data` to the child's stdin and read its stdout and stderr to their
    ends; TimeoutExpired at `deadline` (a cap on a hung child, not a verdict)."""
    chunks: dict[int, list[bytes]] = {stdout: [], stderr: []}
    pending = memoryview(data or b"")
    selector = selectors.DefaultSelector()
    for fd in (stdout, stderr):
        selector.register(fd, selectors.EVENT_READ)
    if stdin >= 0:
        if pending:
            os.set_blocking(stdin, False)
            selector.register(stdin, selectors.EVENT_WRITE)
        else:
            os.close(stdin)
    try:
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired("exirc", 0)
            for key, _ in selector.select(left):
                fd = int(key.fd)
                if fd == stdin:
                    try:
                        pending = pending[os.write(fd, pending[:65536]):]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(fd)
                        os.close(fd)
                    continue
                chunk = os.read(fd, 65536)
                if chunk:
                    chunks[fd].append(chunk)
                else:
                    selector.unregister(fd)
    finally:
        for registered in list(selector.get_map()):
            selector.unregister(registered)
        for fd in (stdin, stdout, stderr):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
    return b"".join(chunks[stdout]), b"".join(chunks[stderr])


def _read_message(sock: socket.socket) -> dict[str, Any]:
    size = _HEADER.unpack(_read_exactly(sock, _HEADER.size))[0]
    message: dict[str, Any] = json.loads(_read_exactly(sock, size))
    return message


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the warm exirc server closed its socket")
        data += chunk
    return data


def _send_message(sock: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


_SERVER: _Server | None = None


def _server() -> _Server | None:
    """This process's server, started on first use (None: real processes only)."""
    global _SERVER
    if os.environ.get("EXIRC_TEST_REAL_PROCESSES", "") not in ("", "0"):
        return None
    if _SERVER is None or _SERVER.process.poll() is not None:
        _SERVER = _Server()
    return _SERVER


# -- the server -------------------------------------------------------------------


def _serve(sock: socket.socket) -> None:
    """Fork a child per request until the client goes; report each child's pid,
    then its wait status."""
    import importlib

    for name in WARM_MODULES:
        importlib.import_module(name)
    # Frozen before the first fork: a child's garbage collections skip the objects it
    # inherited (about a million, from torch), as a test process's do (tests/conftest.py).
    gc.freeze()
    while True:
        try:
            header, fds, _, _ = socket.recv_fds(sock, _HEADER.size, 3)
        except OSError:
            return
        if not header:
            return
        request = json.loads(_read_exactly(sock, _HEADER.unpack(header)[0]))
        pid = os.fork()
        if pid == 0:
            sock.close()
            _child(request, fds)
        for fd in fds:
            os.close(fd)
        _send_message(sock, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send_message(sock, {"status": status})


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """Become the command: its stdio, directory, environment, argv and limits;
    run `main`, then exit as a Python process does (atexit handlers, flushed
    streams). Never returns."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if request["file_size_limit"] is not None:
            import resource
            limit = int(request["file_size_limit"])
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
    except BaseException:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        os._exit(120)
    try:
        from exirc.cli.app import main

        sys.argv = [os.path.join(os.path.dirname(sys.modules["exirc"].__file__ or ""),
                                 "__main__.py"), *request["argv"]]
        code = main(request["argv"])
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 (as the interpreter reports an uncaught error)
        import traceback
        traceback.print_exc()
        code = 1
    try:
        import atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))
