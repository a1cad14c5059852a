"""Process management shared by the simulation launcher and the deployment launcher.

``running.launch`` (``flower-pfl run``) and ``running.deploy`` (``flower-pfl deploy``)
both start Flower processes (SuperLink, SuperNodes, ``flwr run``) and must stop every one
of them -- and everything those start (SuperExec, ServerApp, Ray) -- by PID, also on
failure, Ctrl-C, SIGTERM or SIGHUP.  That machinery lives here, so the imports run one
way: launch -> procs, deploy -> procs, bench -> procs; the command line
(``flower_pfl.cli``) sits above them all.  :func:`flwr_run` is the one way a federation is
run here: write its ``run-config.toml``, ``flwr run --stream`` it with the watchdog
(:func:`stream_run`), and check its FINAL status (``flwr run --stream`` exits 0 even when
the run failed).  Every process is started through :func:`flower_pfl.child.spawn` (or
:func:`~flower_pfl.child.run`): none outlives the launcher, even one killed with SIGKILL
(PDEATHSIG and the reaper process, see :mod:`flower_pfl.child`).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Callable, Iterable, Mapping, Sequence

# ``X as X``: re-exported (launch, deploy, sites, rayhead, node_console and the tests take
# them from here)
from flower_pfl.child import is_alive as is_alive
from flower_pfl.child import proc_stats as proc_stats
from flower_pfl.child import run as run
from flower_pfl.child import spawn as spawn
from flower_pfl.child import stop_tree as stop_tree
from flower_pfl.config import APP_DIR as APP_DIR
from flower_pfl.reporting.log_lines import strip_ansi
from flower_pfl.running.app_stage import app_for_flwr_run


class LaunchError(RuntimeError):
    pass


#: what is called with every line a run prints (``flwr_run``'s and ``stream_run``'s ``on_line``)
OnLine = Callable[[str], object]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # (host, port) of an AF_INET socket
        return port


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, session id), from /proc (Linux)."""
    table: dict[int, tuple[int, int]] = {}
    for pid, fields in proc_stats().items():
        try:
            table[pid] = (int(fields[1]), int(fields[3]))
        except (IndexError, ValueError):
            continue
    return table


def process_tree(root: int) -> set[int]:
    """``root``, its descendants, and every process in their sessions (Ray daemons re-parent)."""
    table = _proc_table()
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in table.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    sessions = {table[p][1] for p in tree if p in table} - {os.getsid(0)}
    tree |= {pid for pid, (_, sid) in table.items() if sid in sessions}
    tree.discard(os.getpid())
    return tree


def pids_naming(text: str) -> set[int]:
    """Processes whose command line contains ``text`` (e.g. a Ray instance's temp dir)."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if text.encode() in fh.read():
                        pids.add(int(entry))
            except OSError:
                continue
    return pids


class ProcessSet:
    """Processes this launcher started; ``stop()`` ends them and all their descendants."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes] | subprocess.Popen[str]] = []
        self.known: set[int] = set()

    def start(self, cmd: Sequence[str], env: Mapping[str, str], log_path: Path
              ) -> subprocess.Popen[bytes]:
        """Start ``cmd`` with its output appended to ``log_path``, without the colour codes
        Flower's logger writes whatever its output is (:func:`copy_plain`)."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        proc = spawn(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     stdin=subprocess.DEVNULL)
        threading.Thread(target=copy_plain, args=(proc.stdout, log_path), daemon=True).start()
        self.procs.append(proc)
        return proc

    def snapshot(self) -> None:
        for proc in self.procs:
            self.known |= process_tree(proc.pid)

    def stop(self) -> None:
        self.snapshot()
        stop_tree(self.known)
        for proc in self.procs:
            try:
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass


def copy_plain(stream: Iterable[bytes], log_path: Path) -> None:
    """Append a process' output (bytes) to ``log_path`` line by line, without ANSI codes."""
    with open(log_path, "a", encoding="utf-8") as log:
        for raw in stream:
            log.write(strip_ansi(raw.decode("utf-8", errors="replace")))
            log.flush()


def flwr_env(flwr_home: Path, port: int) -> dict[str, str]:
    env = os.environ.copy()
    bin_dir = str(Path(sys.executable).parent)  # flower-superexec etc. live beside python
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["FLWR_HOME"] = str(flwr_home)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(port)
    env["FLWR_LOCAL_CONTROL_API_PORT"] = str(port)
    env.setdefault("RAY_DEDUP_LOGS", "0")
    # The simulation process runs the ServerApp (numpy math on the model matrix) while Ray
    # starts in the same process; OpenBLAS's own thread pool there was seen spinning forever
    # in exec_blas (under the model store's np.dot). One BLAS thread per process
    # removes that pool (exec_blas is not used single-threaded); torch keeps its own threads
    # (client-resources.num-cpus). Set OPENBLAS_NUM_THREADS yourself to override.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    # Without an address, ray.init() joins the cluster last started with `ray start` on this
    # machine (/tmp/ray/ray_current_cluster) -- and hangs if that cluster is gone. Start a
    # private Ray instance unless the user names a cluster in RAY_ADDRESS.
    env.setdefault("RAY_ADDRESS", "local")
    # SuperExec looks for new ClientApp/ServerApp tasks every 1 s by default; every message
    # in deployment waits for that poll, so poll faster (Flower allows down to 0.01 s).
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")
    # Everything here talks to 127.0.0.1: never through an HTTP proxy from the environment.
    for key in ("NO_PROXY", "no_proxy"):
        env[key] = ",".join(filter(None, [env.get(key, ""), "127.0.0.1", "localhost", "::1"]))
    return env


def bin_path(name: str) -> str:
    """A console script of this environment (beside its python), else the one on PATH."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else (shutil.which(name) or name)


def wait_http(url: str, timeout_s: float,
              proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None = None,
              cafile: str | None = None) -> None:
    import ssl

    # loopback: never via a proxy
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if cafile:
        handlers.append(urllib.request.HTTPSHandler(
            context=ssl.create_default_context(cafile=cafile)))
    opener = urllib.request.build_opener(*handlers)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise LaunchError(f"process exited with code {proc.returncode} before {url} answered")
        try:
            with opener.open(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise LaunchError(f"{url} did not answer within {timeout_s:.0f}s")



def toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid TOML basic string


def run_status(run_id: str, env: Mapping[str, str]) -> str:
    out = run([bin_path("flwr"), "ls", "--run-id", run_id, "--format", "json"],
              env=env, capture_output=True, text=True, timeout=60)
    try:
        runs = json.loads(out.stdout).get("runs", [])
    except json.JSONDecodeError as exc:
        raise LaunchError(f"could not read the run's status: {out.stdout[-500:]}"
                          f"{out.stderr[-500:]}") from exc
    return str(runs[0]["status"]) if runs else "unknown"


@dataclass
class RunOutcome:
    status: str
    run_id: str | None
    pids: set[int]  # every process the run started (all stopped when this returns)


def toml_value(value: str | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return toml_string(str(value))


def flwr_run(run_config: Mapping[str, str | bool], workdir: Path, env: Mapping[str, str],
             procs: ProcessSet,
             log_path: Path, *, federation: str = "local", federation_config: str | None = None,
             app_dir: Path = APP_DIR, echo: bool = True, timeout_s: float | None = None,
             on_line: OnLine | None = None, stall_s: float | None = None,
             append: bool = False, see: Sequence[Path] = ()) -> RunOutcome:
    """Run a federation through ``flwr run`` and return its final status.

    Writes ``run_config`` (the app's run-config keys: strings and booleans) to
    ``workdir/run-config.toml``, runs ``flwr run APP FEDERATION --stream`` (APP: ``app_dir``
    staged by :func:`~flower_pfl.running.app_stage.app_for_flwr_run`) on the SuperLink
    that ``env`` names (``--federation-config`` where given), streams its log to ``log_path``
    (:func:`stream_run`: ``timeout_s``, the ``stall_s`` watchdog, ``on_line``), remembers
    the processes it started in ``procs`` and checks the run's FINAL status: a LaunchError
    (naming ``log_path`` and ``see``) unless ``finished:completed``.  The outcome's ``pids``
    are every process ``procs`` knows by then."""
    path = Path(workdir) / "run-config.toml"
    path.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in run_config.items()))
    with tempfile.TemporaryDirectory(prefix="flower-pfl-app-") as scratch:
        # the app without its .venv & co., which Flower's bundle build would walk file by file
        app = app_for_flwr_run(app_dir, Path(scratch), run_config)
        cmd = [bin_path("flwr"), "run", str(app), federation, "--stream"]
        if federation_config is not None:
            cmd += ["--federation-config", federation_config]
        cmd += ["--run-config", str(path)]
        run_id = stream_run(cmd, env, log_path, echo, timeout_s, procs, on_line=on_line,
                            stall_s=stall_s, append=append)
    procs.snapshot()
    status = run_status(run_id, env) if run_id else "unknown"
    if status != "finished:completed":
        where = " and ".join(str(p) for p in (log_path, *see))
        raise LaunchError(f"run {run_id or '?'} ended with status '{status}'; see {where}")
    return RunOutcome(status, run_id, set(procs.known))


PROGRESS = re.compile(r"\[flower-pfl\]|aggregate_fit|aggregate_evaluate|configure_fit|"
                      r"configure_evaluate|\[ROUND|\[INIT\]|Successfully started run")


def stream_run(cmd: list[str], env: Mapping[str, str], log_path: Path, echo: bool,
               timeout_s: float | None, procs: ProcessSet, on_line: OnLine | None = None,
               stall_s: float | None = None, append: bool = False) -> str | None:
    """Run ``flwr run --stream``, tee its output, return the run id; ``on_line(line)`` is
    called for every line (tests use it to act at a given round).

    Watchdog: with ``stall_s``, a run whose log shows no progress (no round, no message
    round-trip, no strategy line) for ``stall_s`` seconds is stopped with a LaunchError;
    ``timeout_s`` bounds the whole run.  Lines are read on a thread, so both fire even
    when the run prints nothing at all (a hang).
    """
    run_id = None
    last_snapshot = 0.0
    started = time.time()
    deadline = None if timeout_s is None else started + timeout_s
    last_progress, last_line = started, "(nothing yet)"
    lines: queue.Queue[str | None] = queue.Queue()
    tty = sys.stdout.isatty()
    with open(log_path, "a" if append else "w") as log:
        proc = spawn(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     text=True)
        procs.procs.append(proc)
        assert proc.stdout is not None

        def pump(stream: IO[str]) -> None:
            for text in stream:
                lines.put(text)
            lines.put(None)
        threading.Thread(target=pump, args=(proc.stdout,), daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                line = ""
            if line is None:
                break
            now = time.time()
            if line:
                plain = strip_ansi(line)  # Flower colours its log even into a pipe
                log.write(plain)
                log.flush()
                if echo:
                    sys.stdout.write(line if tty else plain)
                    sys.stdout.flush()
                match = re.search(r"Successfully started run (\d+)", line)
                if match:
                    run_id = match.group(1)
                if PROGRESS.search(line):
                    last_progress, last_line = now, line.strip()[:200]
                if on_line is not None:
                    on_line(line)
            if now - last_snapshot > 1.0:  # a /proc scan, at most once a second
                procs.snapshot()  # remember ServerApp/Ray PIDs while they are alive
                last_snapshot = now
            if deadline is not None and now > deadline:
                raise LaunchError(f"run exceeded {timeout_s:.0f}s; see {log_path}")
            if stall_s is not None and now - last_progress > stall_s:
                raise LaunchError(
                    f"watchdog: no progress for {stall_s:.0f}s (no round finished, no message "
                    f"answered); the last progress line was: {last_line!r}. The run was stopped; "
                    f"see {log_path}. Raise 'stall-timeout' if rounds legitimately take longer.")
        proc.wait()
    return run_id


# ---------------------------------------------------------------------------- signals
class Terminated(KeyboardInterrupt):
    """SIGTERM/SIGHUP, turned into an exception so that every ``finally`` stops its processes."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    # One stop is enough: ignore repeats (a scheduler often sends TERM twice) while the
    # ``finally`` blocks stop the processes this launcher started.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP stop the launcher the way Ctrl-C (SIGINT) does: every process it
    started is stopped by PID on the way out (call once, from the main thread).  SIGINT
    gets Python's own handler back: a launcher started with SIGINT ignored (``nohup``, a
    script's ``trap '' INT``, a shell's background job) inherits SIG_IGN, and Python then
    leaves Ctrl-C ignored."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_terminated)


#: the signals that stop a run: Ctrl-C, a scheduler's or ``kill``'s TERM, a closed terminal
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopAfterRound:
    """Signals that end a run in two steps (call :meth:`install` from the main thread).

    The first SIGINT/SIGTERM/SIGHUP calls ``ask(signum)`` -- ``flower-pfl run`` writes the
    stop file the ServerApp reads after every round -- and the run goes on to the end of
    the round it is in, checkpoints it and ends with status ``stopped``.  A second one
    raises :class:`Terminated` (a ``KeyboardInterrupt``): every ``finally`` stops every
    process by PID at once, and the run is left at its last checkpoint.  SIGINT's handler
    is installed whatever it was before (a launcher started with SIGINT ignored can be
    stopped with Ctrl-C too)."""

    def __init__(self, ask: Callable[[int], object]) -> None:
        self.ask = ask
        self.signum: int | None = None  # the first signal received

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
            self.ask(signum)
            return
        for sig in STOP_SIGNALS:  # one hard stop is enough; ignore repeats while stopping
            signal.signal(sig, signal.SIG_IGN)
        raise Terminated(signum)

