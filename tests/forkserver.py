"""Fresh Python processes for the tests, without paying for torch's import in each one.

A test that runs its case in a new interpreter (``python -c CODE``, ``python -m MODULE`` or
``python SCRIPT``, e.g. ``test_bad_inputs.py``) gets isolation: nothing it changes reaches the
next test, and a crash in native code fails that one test with the exit status. Each such
process spends about five CPU seconds importing torch, dynamo, AOTAutograd, ONNX and the
exporter before the case's first line has done anything.

:func:`run` keeps that isolation for less: a server process per pytest worker imports those
libraries once (:data:`PRELOAD`: third-party modules only, never ort-lazy, whose import and
environment are the case's own) and forks a child per call. The child starts from that state
as a fresh interpreter would after the same imports: the call's environment (``os.environ``
replaced), working directory, ``sys.argv``, ``sys.path`` as ``python`` would build it for that
``PYTHONPATH``, directory and form (asked of a real interpreter, once per ``PYTHONPATH`` and
directory), its own ``__main__``, stdout and stderr on its own files, exit handlers run, and the
exit status a ``subprocess.run`` would give (the signal that killed it included). What differs:
the preloaded modules are in ``sys.modules`` from the start, so a case that checks what its own
imports load (``test_disk_cache.py``, ``test_bridge_build.py``) keeps ``subprocess.run``. The
server only imports;
it runs no torch op, and forks only while it holds no thread but those its imports started
(numpy's OpenBLAS pool, which OpenBLAS stops and restarts around a fork); else the call runs in
a new interpreter.

The server takes the environment of the first call (one server per test process). A call whose
environment differs from the server's in anything but ``ORT_LAZY_*`` variables,
``PYTHONPATH`` (those are read after the imports) and ``PYTEST_CURRENT_TEST``, or any call when
the server cannot start, runs in a new interpreter (``subprocess.run``), as does every call with
``ORT_LAZY_TEST_FORKSERVER=0`` in the test run's environment.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: what the server imports before it forks: what a first ``torch.compile(backend="ort")`` in a
#: new process imports (torch, dynamo, AOTAutograd and their lazy imports, ONNX, the exporter,
#: onnxscript's torch library); not ort-lazy, nor onnxruntime (its import starts a thread, and
#: takes milliseconds once numpy is in)
PRELOAD = (
    "torch",
    "torch._dynamo",
    "torch._dynamo.backends.common",
    "torch._functorch.aot_autograd",
    "torch._inductor.decomposition",
    "torch._inductor.compile_fx",
    "torch._export",
    "torch.export",
    "torch.fx.experimental.proxy_tensor",
    "functorch.compile",
    "networkx",
    "onnx",
    "onnx_ir",
    "onnxscript",
    "onnxscript.optimizer",
    "onnxscript.rewriter",
    "onnxscript.function_libs.torch_lib.ops",
    "torch.onnx._internal.exporter._core",
    "torch.onnx._internal.exporter._registration",
)

#: environment variables a forked child may have other than the server's: read after the
#: imports (ort-lazy's, ``PYTHONPATH`` by :meth:`_Server.sys_path`), or pytest's name of the
#: test that runs
_OWN_PREFIX = "ORT_LAZY_"
_OWN = ("PYTHONPATH", "PYTEST_CURRENT_TEST")
_OFF = "ORT_LAZY_TEST_FORKSERVER"


# ---------------------------------------------------------------------------------- client


def _form(argv: list[str]) -> tuple[str, str, list[str]] | None:
    """``(form, target, args)`` of a ``python`` command line: ``-c CODE``, ``-m MODULE`` or
    ``SCRIPT``; None for anything else (interpreter options)."""
    if len(argv) < 2:
        return None
    if argv[1] in ("-c", "-m"):
        return (argv[1], argv[2], argv[3:]) if len(argv) > 2 else None
    if argv[1].startswith("-"):
        return None
    return ("script", argv[1], argv[2:])


def _own(key: str) -> bool:
    return key.startswith(_OWN_PREFIX) or key in _OWN


def _differs(env: dict[str, str], base: dict[str, str]) -> bool:
    return {k: v for k, v in env.items() if not _own(k)} != {k: v for k, v in base.items() if not _own(k)}


class _Server:
    """One server process (started with the environment of its first call, less the variables
    a call may change: :func:`_own`)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = {k: v for k, v in env.items() if not _own(k)}
        self.paths: dict[tuple[str, str], list[str]] = {}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"import runpy; runpy.run_path({__file__!r}, run_name='__forkserver__')"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self.env,
            cwd="/",
        )
        ready = self._read(600)
        if ready is None or not ready.get("ready"):
            self.close()
            raise OSError(f"the fork server did not start: {ready}")

    def _read(self, timeout: float | None) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        if timeout is not None:
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            if not ready:
                return None
        line = self.proc.stdout.readline()
        if not line:
            raise OSError("the fork server exited")
        return json.loads(line)

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def sys_path(self, pythonpath: str, cwd: str) -> list[str]:
        """``sys.path`` of a ``python -c`` with this ``PYTHONPATH`` in ``cwd``, asked of a real
        interpreter (it imports nothing: milliseconds)."""
        key = (pythonpath, cwd)
        if key not in self.paths:
            env = {**self.env, "PYTHONPATH": pythonpath} if pythonpath else self.env
            out = subprocess.run(
                [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"],
                env=env, capture_output=True, text=True, check=True, cwd=cwd,
            )
            self.paths[key] = json.loads(out.stdout)
        return list(self.paths[key])

    def run(
        self, form: str, target: str, args: list[str], env: dict[str, str], cwd: str, timeout: float | None
    ) -> subprocess.CompletedProcess[str] | None:
        path = self.sys_path(env.get("PYTHONPATH", ""), cwd)  # its first entry: "" (-c)
        if form == "-m":
            path[0] = cwd
        elif form == "script":
            path[0] = os.path.dirname(os.path.realpath(os.path.join(cwd, target)))
        with tempfile.TemporaryDirectory(prefix="forkserver-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            self._send({"form": form, "target": target, "args": args, "env": env, "cwd": cwd,
                        "path": path, "stdout": str(out), "stderr": str(err)})
            started = self._read(60)
            if started is None or "pid" not in started:
                return None  # no fork (a second thread in the server): a new interpreter
            pid = started["pid"]
            done = self._read(timeout)
            if done is None:
                os.kill(pid, signal.SIGKILL)
                self._read(None)
                raise subprocess.TimeoutExpired([sys.executable, form, target], timeout or 0)
            code = done["status"]
            return subprocess.CompletedProcess(
                [sys.executable, form, target, *args],
                code,
                out.read_text(encoding="utf-8", errors="replace"),
                err.read_text(encoding="utf-8", errors="replace"),
            )

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


_servers: list[_Server] = []
_failed: list[str] = []
#: how the calls of this process ran: forked by a server, or as a new interpreter
counts = {"forked": 0, "new": 0}


@atexit.register
def _close_servers() -> None:
    while _servers:
        _servers.pop().close()


def _server(env: dict[str, str]) -> _Server | None:
    for s in _servers:
        if not _differs(env, s.env):
            return s
    if _failed or _servers or sys.platform == "win32" or not hasattr(os, "fork"):  # one server
        return None
    try:
        s = _Server(env)
    except (OSError, ValueError) as e:
        _failed.append(str(e))
        return None
    _servers.append(s)
    return s


def run(
    argv: list[str], env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, env=env, cwd=cwd, timeout=timeout, capture_output=True, text=True)``
    for ``argv`` = ``[sys.executable, "-c" | "-m" | SCRIPT, ...]``, run as a fork of the server
    where it can be (see the module docstring)."""
    env = dict(os.environ if env is None else env)
    cwd = os.path.abspath(cwd if cwd is not None else os.getcwd())
    form = _form(argv) if argv and argv[0] == sys.executable else None
    server = None
    if form is not None and os.environ.get(_OFF, "1") != "0":
        server = _server(env)
    if server is not None:
        try:
            done = server.run(*form, env, cwd, timeout)
        except (OSError, ValueError):
            _servers.remove(server)
            server.close()
            done = None
        if done is not None:
            counts["forked"] += 1
            return done
    counts["new"] += 1
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------- server


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def _child(request: dict[str, Any], protocol: list[int]) -> None:
    """Become the requested interpreter; never returns."""
    code = 1
    try:
        for fd in protocol:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (null, out, err):
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.path[:] = request["path"]
        sys.path_importer_cache.clear()
        import random

        random.seed()
        import types

        form, target, args = request["form"], request["target"], request["args"]
        try:
            if form == "-c":
                sys.argv = ["-c", *args]
                main = types.ModuleType("__main__")
                sys.modules["__main__"] = main
                exec(compile(target, "<string>", "exec"), main.__dict__)
            elif form == "-m":
                import runpy

                sys.argv = [target, *args]
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                import runpy

                sys.argv = [target, *args]
                runpy.run_path(target, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = _exit_code(e)
        except BaseException:
            kind, value, tb = sys.exc_info()
            sys.excepthook(kind, value, tb.tb_next if tb is not None else None)  # from the case's own frame
            code = 1
        import threading

        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()  # non-daemon threads end first, as at an interpreter's exit
        atexit._run_exitfuncs()
    except BaseException:
        try:
            import traceback

            traceback.print_exc()
        except BaseException:
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve() -> None:
    import importlib

    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    protocol = [requests.fileno(), replies.fileno()]

    def reply(**message: Any) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    start = time.perf_counter()
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    except BaseException as e:
        reply(ready=False, error=f"{type(e).__name__}: {e}")
        return
    threads = _threads()
    reply(ready=True, seconds=round(time.perf_counter() - start, 2), threads=threads)
    for line in requests:
        request = json.loads(line)
        if _threads() > threads:  # (fewer: OpenBLAS stops its pool at a fork, restarts it when used)
            reply(error=f"{_threads()} threads in the server, {threads} after its imports: no fork")
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, protocol)
        reply(pid=pid)
        _, status = os.waitpid(pid, 0)
        reply(status=os.waitstatus_to_exitcode(status))


if __name__ == "__forkserver__":
    _serve()
