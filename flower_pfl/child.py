"""Child processes: the one way this project starts one, tied to the life of its launcher.

:func:`spawn` (a ``subprocess.Popen``) and :func:`run` (a ``subprocess.run``) are what every
process start of flower-pfl goes through (``running.procs``, ``running.sites``,
``running.deploy``, ``running.rayhead``, :func:`run_python`).  A child must not outlive the
process that started it, whatever ends that process -- SIGKILL included, where no
``finally`` runs.  Two mechanisms (Linux), each enough for what it covers:

* **PDEATHSIG**: the child asks the kernel, before it execs, for SIGTERM when its parent
  dies (``prctl(PR_SET_PDEATHSIG)``), and exits at once if the parent is already gone (the
  race between ``fork`` and ``prctl``).  The kernel sends it when the *thread* that forked
  the child ends, so :func:`spawn` sets it only from the main thread (:func:`run`, which
  waits for its child, from any thread).  Flower's SuperLink and SuperNode end their
  SuperExec, ServerApp and ClientApp processes on SIGTERM (and those watch their parent's
  PID); Ray's daemons share the fate of the driver that started them.
* **The reaper**: one small process per launcher (started with the first watched child,
  in a session of its own, so the terminal's signals do not reach it) holding the read end
  of a pipe whose write end only the launcher holds.  The launcher tells it each child's
  PID and session; every second (while any is alive) it records their descendants -- by
  PID and start time -- and those descendants' sessions.  When the pipe closes (the
  launcher ended, by any signal), it sends SIGTERM to every recorded process still alive
  and every process in a recorded session, SIGKILL after 10 s, and exits.  That covers
  what PDEATHSIG cannot: grandchildren that detach into a session of their own (Flower's
  SuperExec, the SuperLink ``flwr run`` may start) or outlive their parent by design
  (``ray start``'s daemons), and children that ignore SIGTERM.  A launcher that ends
  normally waits for it (at exit, at most 30 s) so nothing of it is left.

:func:`run_python` runs a few lines of Python in a short-lived child of the same interpreter,
where a long-lived process must not import torch (importing this CUDA build of torch costs a
process ~280 MB of private memory even on a CPU run): the launcher's preflight check
(reliability.preflight) and the ServerApp's initial model (server_app).

Only the standard library is imported here: the reaper imports this module alone.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Sequence

PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: switches for tests and the mutation suite (module attributes, read at each spawn)
PDEATHSIG = True
REAPER = True
#: what the reaper does when the launcher is gone: SIGTERM, this long, then SIGKILL (the
#: value when the reaper starts)
GRACE_S = 10.0
POLL_S = 1.0  # how often the reaper records the descendants while any is alive


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # resolved here: the child only calls it (fork-safe)


def _tie_to(parent: int) -> Callable[[], None]:
    """The child's ``preexec_fn``: SIGTERM when ``parent`` dies; exit if it already has."""
    prctl, term = _PRCTL, int(signal.SIGTERM)

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, term, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody will signal us
            os._exit(1)
    return preexec


def spawn(cmd: Sequence[str], *, session: bool = True, watch: bool = True,
          pdeathsig: bool | None = None, **popen: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(cmd, **popen)`` that does not outlive this process.

    ``session``: the child leads a new session (Ctrl-C on the terminal reaches this process
    only, which stops the child by PID; the reaper kills the whole session).
    ``pdeathsig``: SIGTERM to the child when this process dies; default: when called from
    the main thread (the kernel signals when the forking *thread* ends).  ``watch``: tell
    the reaper (started on first use) the child's PID and session.  Raises what Popen
    raises (``OSError`` for a missing program)."""
    if pdeathsig is None:
        pdeathsig = threading.current_thread() is threading.main_thread()
    if PDEATHSIG and pdeathsig and sys.platform.startswith("linux"):
        if popen.get("preexec_fn") is not None:
            raise ValueError("spawn sets preexec_fn itself")
        popen["preexec_fn"] = _tie_to(os.getpid())
    lifeline = _lifeline_here() if REAPER and watch else None  # before the child exists
    proc = subprocess.Popen(list(cmd), start_new_session=session, **popen)
    if lifeline is not None:
        lifeline.watch(proc.pid, proc.pid if session else 0)
    return proc


def run(cmd: Sequence[str], *, timeout: float | None = None, input: str | bytes | None = None,
        check: bool = False, capture_output: bool = False, session: bool = False,
        watch: bool = True, **popen: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` through :func:`spawn` (PDEATHSIG from any thread: this thread waits
    for the child).  By default the child stays in this process's session, as
    ``subprocess.run`` leaves it.  Raises ``subprocess.TimeoutExpired`` past ``timeout``
    (the child killed) and ``CalledProcessError`` with ``check`` and a non-zero exit."""
    if capture_output:
        popen["stdout"] = popen["stderr"] = subprocess.PIPE
    if input is not None:
        popen["stdin"] = subprocess.PIPE
    with spawn(cmd, session=session, watch=watch, pdeathsig=True, **popen) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            exc.stdout, exc.stderr = proc.communicate()
            raise
        except BaseException:
            proc.kill()
            raise
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, list(cmd), out, err)
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def run_python(code: str, *args: str, timeout_s: float | None = None
               ) -> subprocess.CompletedProcess[str]:
    """``python -c code args...`` with this process's ``sys.path``; output captured as text.
    Raises ``subprocess.TimeoutExpired`` past ``timeout_s``.  The child dies with this
    process (PDEATHSIG; it starts nothing itself, so no reaper is started for it)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
               timeout=timeout_s, watch=False)


# ------------------------------------------------------------------------ /proc
def proc_stats() -> dict[int, list[str]]:
    """pid -> the fields of its /proc/PID/stat after the command name (``[0]`` is the
    state, ``[1]`` the ppid, ``[3]`` the session, ``[11]``/``[12]`` utime/stime in clock
    ticks, ``[19]`` the start time), for every process now on the machine (Linux)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                table[int(entry)] = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
    return table


def is_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_tree(pids: set[int], grace_s: float = 10.0) -> None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL whatever is left (5 s more at most)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.time() < deadline:
            alive = {p for p in pids if is_alive(p)}
            if not alive:
                return
            time.sleep(0.2)
        pids = alive


# ---------------------------------------------------------------------- reaper
class _Lifeline:
    """The launcher's end of the reaper's pipe (one per process, :func:`_lifeline_here`)."""

    def __init__(self) -> None:
        read, self.fd = os.pipe()  # both non-inheritable: no other child gets the write end
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        code = ("import sys; from flower_pfl.child import reaper_main; "
                "reaper_main(int(sys.argv[1]), grace_s=float(sys.argv[2]))")
        try:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(  # not spawn: outlives us
                [sys.executable, "-c", code, str(os.getpid()), str(GRACE_S)], stdin=read,
                stdout=subprocess.DEVNULL, start_new_session=True, env=env)
        finally:
            os.close(read)
        self.pid = os.getpid()
        self.lock = threading.Lock()
        atexit.register(self.close)

    def watch(self, pid: int, sid: int) -> None:
        with self.lock:
            try:
                os.write(self.fd, f"{pid} {sid}\n".encode())
            except OSError:  # the reaper is gone (killed): PDEATHSIG still holds
                pass

    def close(self, wait_s: float = 30.0) -> None:
        """Close the pipe (the reaper stops what is left) and wait for the reaper."""
        if self.fd < 0 or os.getpid() != self.pid:
            return
        os.close(self.fd)
        self.fd = -1
        if self.proc is not None:
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass


_lifeline: _Lifeline | None = None
_lifeline_lock = threading.Lock()


def _lifeline_here() -> _Lifeline:
    global _lifeline
    with _lifeline_lock:
        if _lifeline is None or _lifeline.pid != os.getpid():
            _lifeline = _Lifeline()
        return _lifeline


def _forget_in_fork() -> None:
    # a fork of the launcher must not hold the pipe open (the reaper would wait for it)
    # nor write to it
    global _lifeline
    if _lifeline is not None and _lifeline.fd >= 0:
        try:
            os.close(_lifeline.fd)
        except OSError:
            pass
        _lifeline.fd = -1
    _lifeline = None


os.register_at_fork(after_in_child=_forget_in_fork)


class Reaper:
    """The reaper's records: the launcher's children (``add``), their descendants by PID
    and start time, and the sessions they lead or joined (:meth:`record`); :meth:`targets`
    is what to stop.  Never the sessions of ``spare`` (the launcher's, the reaper's)."""

    def __init__(self, spare: set[int]) -> None:
        self.spare = spare
        self.known: dict[int, str] = {}  # pid -> start time (a reused PID is not ours)
        self.sessions: set[int] = set()

    def add(self, pid: int, sid: int) -> None:
        self.known.setdefault(pid, "")
        if sid and sid not in self.spare:
            self.sessions.add(sid)

    def record(self, table: dict[int, list[str]]) -> None:
        ours = {p for p, start in self.known.items()
                if p in table and start in ("", table[p][19])}
        children: dict[int, list[int]] = {}
        for pid, fields in table.items():
            children.setdefault(int(fields[1]), []).append(pid)
        frontier = list(ours)
        while frontier:
            for pid in children.get(frontier.pop(), ()):
                if pid not in ours:
                    ours.add(pid)
                    frontier.append(pid)
        self.sessions |= {int(table[p][3]) for p in ours} - self.spare
        ours |= {p for p, f in table.items() if int(f[3]) in self.sessions}
        self.known = {p: table[p][19] for p in ours}  # the dead are forgotten
        self.sessions = {s for s in self.sessions
                         if any(int(f[3]) == s for f in table.values())}

    def targets(self, table: dict[int, list[str]]) -> set[int]:
        self.record(table)
        return {p for p in self.known if table[p][0] != "Z"} - {os.getpid()}


def reaper_main(launcher: int, fd: int = 0, grace_s: float = GRACE_S) -> None:
    """The reaper process: read ``PID SID`` lines from ``fd`` (the launcher's pipe) until
    it closes, recording as :class:`Reaper`; then stop every recorded process still alive
    (SIGTERM, ``grace_s`` seconds, SIGKILL)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    spare = {os.getsid(0)}
    try:
        spare.add(os.getsid(launcher))
    except OSError:
        pass  # already gone
    records, pending = Reaper(spare), b""
    while True:
        ready, _, _ = select.select([fd], [], [], POLL_S if records.known else None)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                pid, sid = (int(x) for x in line.split())
                records.add(pid, sid)
        records.record(proc_stats())
    targets = records.targets(proc_stats()) - {launcher}
    if targets:
        stop_tree(targets, grace_s)
