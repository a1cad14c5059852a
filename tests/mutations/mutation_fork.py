"""A warm parent for the mutation suite's pytest runs: imports the heavy libraries once, forks one
child per run.

Most of a mutation's ``python -m pytest <targets>`` (tests/mutations/mutations.py) is start-up: the
interpreter, then torch, torchvision, Flower, pandas, ... imported again for every mutation
(measured 2026-11-29: ~3 s of a 3.7 s run of one FedAvg test). This module has two halves:

* the server, ``python tests/mutations/mutation_fork.py`` (run by path, never imported as
  ``tests.…``): it imports :data:`PRELOAD` (third-party libraries only, NOTHING of this
  project, so every child imports the mutated copy's code afresh; importing torch does not
  start its thread pools or CUDA, and the server refuses to serve if any import left a second
  thread running, as a fork would copy a half-held lock), writes ``ready`` and then reads one
  JSON request a line on stdin. For each it forks a child, which chdirs into the request's
  ``cwd``, takes the request's environment, puts ``cwd`` and the request's ``PYTHONPATH``
  first on ``sys.path`` (as ``python -m pytest`` run there with that environment would) and
  runs pytest's console entry with ``args`` (or ``code``, as ``python -c``), its stdout and
  stderr in the request's ``out`` and ``err`` files, stdin /dev/null; then the child ends as
  the interpreter does (non-daemon threads joined, atexit handlers run, streams flushed) but
  without tearing down the preloaded modules one by one (``os._exit``), and the server froze
  its objects (``gc.freeze``) so a child's collections -- pytest runs two at its end -- skip
  them: ~2 s of a 3 s run of a 0.3 s test went to those two (2026-12-07). The server waits for it
  (killed after ``timeout`` seconds, as ``subprocess.run``'s timeout does) and answers one
  JSON line: ``{"rc": exit status (-N: killed by signal N), "timed_out": bool}``. One child at
  a time per server; ``{"modules": true}`` answers the server's own ``sys.modules`` (tests).
  End of stdin ends it.
* the client, :class:`WarmRunner` (imported by tests/mutations/mutations.py): starts one server,
  hands it runs (:meth:`WarmRunner.run`, same result as ``subprocess.run`` of the same
  command) and stops it.

No state passes between mutations: each runs in a fresh fork of a parent that never imported
their code (tests/test_mutations_fork.py checks both).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Sequence

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # run by path: tests/mutations/ is not a place to import from

#: imported once by the server (the slowest imports of the mutation targets, measured with
#: ``-X importtime``); all third-party -- never a module of this project. The first
#: :data:`BLAS` of them load numpy's and scipy's OpenBLAS, whose idle worker threads are
#: fork-safe (OpenBLAS stops and restarts them in its pthread_atfork handlers, as every
#: ``multiprocessing`` fork of numpy relies on); no later import may start a thread.
#: Left out for that reason: pandas (pyarrow's jemalloc starts a background thread) and
#: datasets / flwr_datasets (a native thread); and ray (tests/test_raynode.py: never imported).
PRELOAD = ("numpy", "scipy.linalg", "torch", "torchvision", "scipy", "yaml", "flwr",
           "dp_accounting", "matplotlib", "pytest")
BLAS = 2
#: the packages of this project: none may be in the server's sys.modules
PROJECT = ("flower_pfl", "strategies", "clients", "benchmarks", "tests", "configs")
READY = "ready"
HERE = Path(__file__).resolve()


# ------------------------------------------------------------------------------ server side
def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: Python's own count
        import threading
        return threading.active_count()


def _child(request: dict[str, Any], base_path: list[str]) -> int:
    """In the forked child: become the run the request names; its exit status."""
    for fd, name, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        new = os.open(name, flags, 0o644)
        os.dup2(new, fd)
        os.close(new)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *base_path]  # python -m: the cwd, then PYTHONPATH
    importlib.invalidate_caches()
    if "code" in request:  # as `python -c CODE`
        sys.argv = ["-c"]
        exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
        return 0
    import pytest
    from _pytest.config import _console_main  # what pytest/__main__.py calls

    sys.argv = [str(Path(pytest.__file__).with_name("__main__.py")), *request["args"]]
    return _console_main()  # `python -m pytest` raises SystemExit with it


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    deadline = time.monotonic() + timeout
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status), False
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return -1, True
            if fd is not None:
                import select
                select.select([fd], [], [], left)
            else:
                time.sleep(min(0.02, left))
    finally:
        if fd is not None:
            os.close(fd)


def serve(requests: IO[str], answers: IO[str], preload: Sequence[str] = PRELOAD,
          blas: int = BLAS) -> dict[str, Any] | None:
    """Import ``preload``, then fork a child per request until ``requests`` ends (None).
    Returns the request in a child (which then becomes that run), never in the server.
    Refuses (SystemExit) when an import after the first ``blas`` started a thread, or any
    started a Python thread, or imported a module of this project."""
    import gc
    import threading

    allowed = 1
    for i, name in enumerate(preload):
        importlib.import_module(name)
        if i < blas:
            allowed = _threads()
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in PROJECT)
    if loaded:
        raise SystemExit(f"mutation_fork: project modules imported by the server: {loaded}")
    if _threads() != allowed or threading.active_count() != 1:
        raise SystemExit(f"mutation_fork: {_threads()} threads after importing {preload} "
                         f"({allowed} after the BLAS ones; {threading.active_count()} Python "
                         "threads): a fork would copy their locks half-held")
    gc.freeze()  # the preloads' objects: never traversed by a child's collections
    answers.write(READY + "\n")
    answers.flush()
    for line in requests:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("modules"):
            answers.write(json.dumps({"modules": sorted(sys.modules), "threads": _threads(),
                                      "python_threads": threading.active_count()}) + "\n")
            answers.flush()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return request
        rc, timed_out = _wait(pid, float(request.get("timeout", 600)))
        answers.write(json.dumps({"rc": rc, "timed_out": timed_out}) + "\n")
        answers.flush()
    return None


def main(argv: Sequence[str]) -> None:
    preload = PRELOAD
    blas = BLAS
    if argv[:1] == ["--preload"]:  # tests: a lighter warm-up, no BLAS
        preload, blas = tuple(filter(None, argv[1].split(","))), 0
    base_path = list(sys.path)
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the server's own prints never mix with the answers
    request = serve(sys.stdin, answers, preload, blas)
    if request is None:
        return
    answers.close()
    code = 1
    try:
        code = _child(request, base_path)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    _end(code)


def _end(code: int) -> None:
    """End the child as the interpreter ends (non-daemon threads joined, atexit handlers run,
    the standard streams flushed), less its teardown of every module and object the parent
    preloaded, which nothing the run reports depends on."""
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx calls first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(int(code) & 0xFF)  # as sys.exit: the status modulo 256


# ------------------------------------------------------------------------------ client side
class WarmRunner:
    """One warm server (``python tests/mutations/mutation_fork.py``), started with ``env``; runs
    one pytest at a time in a fresh fork. Use as a context manager (the server stops at the
    end); not thread-safe: give each worker thread its own."""

    def __init__(self, python: str, env: dict[str, str], preload: Sequence[str] | None = None):
        env = {k: v for k, v in env.items() if k != "PYTHONPATH"}  # each child sets its own
        cmd = [python, str(HERE)] + (["--preload", ",".join(preload)] if preload is not None
                                     else [])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True, cwd=HERE.parents[2])
        try:
            line = self._answer()
        except RuntimeError:
            self.close()
            raise
        if line != READY:
            self.close()
            raise RuntimeError(f"the warm mutation runner did not start: {line!r}")

    def _answer(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm mutation runner ended (exit {self.proc.wait()}; "
                               "its stderr says why)")
        return line.strip()

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._answer())

    def modules(self) -> dict[str, Any]:
        """The server's sys.modules (sorted) and thread count."""
        return self._ask({"modules": True})

    def run(self, cwd: Path, env: dict[str, str], args: Sequence[str] = (),
            code: str | None = None, timeout: float = 600) -> tuple[int, str, str, bool]:
        """``python -m pytest *args`` (or ``python -c code``) in ``cwd`` with ``env``, in a
        fork: (exit status, stdout, stderr, timed out)."""
        base = Path(cwd).parent / f".{Path(cwd).name}"
        out, err = Path(f"{base}.stdout"), Path(f"{base}.stderr")
        request: dict[str, Any] = {"cwd": str(cwd), "env": dict(env), "out": str(out),
                                   "err": str(err), "timeout": timeout}
        if code is not None:
            request["code"] = code
        else:
            request["args"] = list(args)
        try:
            answer = self._ask(request)
            # as subprocess.run(..., text=True): the locale's encoding, universal newlines
            texts = [p.read_text() if p.exists() else "" for p in (out, err)]
        finally:
            out.unlink(missing_ok=True)
            err.unlink(missing_ok=True)
        return answer["rc"], texts[0], texts[1], answer["timed_out"]

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()

    def __enter__(self) -> "WarmRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    main(sys.argv[1:])
