"""Nothing outlives its launcher, whatever ends it (issue 53, kind 3).

Every process flower-pfl starts goes through ``flower_pfl.child.spawn``/``run``: PDEATHSIG
(SIGTERM when the launcher dies) and the reaper process (stops the launcher's children,
their descendants and their sessions once the launcher's pipe closes).  The fast tests
drive each mechanism alone with small Python launchers; the slow ones SIGKILL a real
``flower-pfl supernode`` (a SuperLink on loopback), ``deploy`` and ``run`` mid-round.
Every check is by PID (and start time, so a reused PID is not mistaken for a survivor):
the launcher's whole process tree is collected from /proc before the kill, and each of
those processes must be gone within :data:`BOUND_S` -- a liveness bound, not a timing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from flower_pfl import child
from flower_pfl.running.procs import free_port, proc_stats, process_tree
from tests.conftest import tiny_run_yaml

REPO = Path(__file__).resolve().parent.parent
BOUND_S = 30.0  # the reaper needs at most its grace (10 s) + 5 s after SIGKILL
FAST_BOUND_S = 15.0  # the fast tests' reaper has a grace of 1 s


def _identity(pid: int) -> tuple[int, str] | None:
    fields = proc_stats().get(pid)
    return None if fields is None else (pid, fields[19])


def _alive(ident: tuple[int, str]) -> bool:
    fields = proc_stats().get(ident[0])
    return fields is not None and fields[19] == ident[1] and fields[0] != "Z"


def _left_after_bound(idents: set[tuple[int, str]], bound_s: float = BOUND_S) -> list[str]:
    """Poll until none of ``idents`` runs or ``bound_s`` passed; the survivors' command
    lines (they are then SIGKILLed, so that a failing test leaves nothing behind)."""
    deadline = time.time() + bound_s
    while time.time() < deadline and any(_alive(i) for i in idents):
        time.sleep(0.2)
    left = []
    for ident in sorted(i for i in idents if _alive(i)):
        try:
            left.append(f"{ident[0]}: " + Path(f"/proc/{ident[0]}/cmdline").read_bytes()
                        .replace(b"\0", b" ").decode(errors="replace")[:160])
            os.kill(ident[0], signal.SIGKILL)
        except OSError:
            pass
    return left


def _env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(REPO), os.environ.get("PYTHONPATH", "")])), "PYTHONUNBUFFERED": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", **extra}


# ------------------------------------------------------------------- fast: the helper
CHILD = textwrap.dedent("""
    import signal, subprocess, sys, time
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    kin = subprocess.Popen(sleep)                              # in the child's session
    apart = subprocess.Popen(sleep, start_new_session=True)    # detached: a session of its own
    if sys.argv[1] == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(kin.pid, apart.pid, flush=True)
    time.sleep(600)
""")


def _launch(tmp_path: Path, body: str) -> tuple[subprocess.Popen, list[int]]:
    """A Python launcher running ``body`` (``child`` imported); it prints PIDs on one line."""
    script = tmp_path / "launcher.py"
    script.write_text("import subprocess, sys, time\nfrom flower_pfl import child\n"
                      + textwrap.dedent(body) + "\ntime.sleep(600)\n")
    launcher = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                text=True, cwd=tmp_path, env=_env(), start_new_session=True)
    line = launcher.stdout.readline()
    assert line.strip(), f"the launcher printed nothing (exit {launcher.poll()})"
    return launcher, [int(x) for x in line.split()]


def _sigkill_and_check(launcher: subprocess.Popen, pids: list[int]) -> list[str]:
    idents = {i for i in map(_identity, pids) if i is not None}
    assert len(idents) == len(pids), "a process ended before the launcher was killed"
    launcher.kill()  # SIGKILL: no handler, no finally, no atexit
    launcher.wait()
    return _left_after_bound(idents, FAST_BOUND_S)


def test_a_child_gets_sigterm_when_its_launcher_is_killed(tmp_path):
    """PDEATHSIG alone (the reaper switched off): the child dies with the launcher."""
    launcher, pids = _launch(tmp_path, """
        child.REAPER = False
        p = child.spawn([sys.executable, "-c", "import time; time.sleep(600)"])
        print(p.pid, flush=True)
    """)
    assert _sigkill_and_check(launcher, pids) == []


def test_the_reaper_stops_grandchildren_detached_ones_and_a_child_ignoring_sigterm(tmp_path):
    """The reaper: a child that ignores SIGTERM (so PDEATHSIG cannot end it) is SIGKILLed
    after the grace; its grandchild in its session and its detached grandchild (a session
    of its own, found as the child's descendant) are stopped too; the reaper then exits."""
    launcher, pids = _launch(tmp_path, f"""
        child.GRACE_S = 1.0
        p = child.spawn([sys.executable, "-c", {CHILD!r}, "stubborn"], stdout=subprocess.PIPE,
                        text=True)
        kin, apart = p.stdout.readline().split()
        print(p.pid, kin, apart, child._lifeline.proc.pid if child._lifeline else "",
              flush=True)
    """)
    assert _sigkill_and_check(launcher, pids) == []


def test_without_the_reaper_grandchildren_survive(tmp_path):
    """The control for the test above: PDEATHSIG ends the child, not its grandchildren."""
    launcher, pids = _launch(tmp_path, f"""
        child.REAPER = False
        p = child.spawn([sys.executable, "-c", {CHILD!r}, "plain"], stdout=subprocess.PIPE,
                        text=True)
        kin, apart = p.stdout.readline().split()
        print(p.pid, kin, apart, flush=True)
    """)
    idents = [_identity(p) for p in pids]
    launcher.kill()
    launcher.wait()
    try:
        deadline = time.time() + FAST_BOUND_S
        while time.time() < deadline and _alive(idents[0]):
            time.sleep(0.1)
        assert [_alive(i) for i in idents] == [False, True, True]
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def test_a_launcher_that_ends_normally_leaves_no_reaper(tmp_path):
    script = tmp_path / "normal.py"
    script.write_text(textwrap.dedent("""
        import sys
        from flower_pfl import child
        p = child.spawn([sys.executable, "-c", "pass"])
        p.wait()
        print(child._lifeline.proc.pid, flush=True)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert not child.is_alive(int(done.stdout))  # waited for at exit


def test_a_child_whose_parent_died_before_prctl_exits_at_once(tmp_path):
    """The fork/prctl race: the preexec check sees another parent and exits before exec."""
    marker = tmp_path / "ran"
    proc = subprocess.Popen([sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                            preexec_fn=child._tie_to(os.getpid() + 1))
    assert proc.wait(timeout=60) == 1 and not marker.exists()


def _stat(ppid: int, sid: int, start: str, state: str = "S") -> list[str]:
    fields = [state, str(ppid), str(sid), str(sid)] + ["0"] * 15 + [start]
    assert fields[19] == start
    return fields


def test_reaper_records_by_hand():
    """launcher 100 (session 100) -> root 200 (session 200) -> 201 -> 300 (setsid: session
    300); 250 joined session 200 without being a descendant; 400 is someone else's; 500 is
    a zombie of ours; after the first record, PID 201 is reused (another start time)."""
    table = {100: _stat(1, 100, "10"), 200: _stat(100, 200, "20"), 201: _stat(200, 200, "21"),
             300: _stat(201, 300, "30"), 250: _stat(1, 200, "25"), 400: _stat(1, 400, "40"),
             500: _stat(200, 200, "50", state="Z"), 301: _stat(1, 300, "31")}
    reaper = child.Reaper(spare={100})
    reaper.add(200, 200)
    reaper.record(table)
    assert reaper.sessions == {200, 300}
    assert set(reaper.known) == {200, 201, 300, 250, 500, 301}
    # 201 exits and its PID is reused by a process that is not ours; 300 is re-parented
    table = {**table, 201: _stat(1, 999, "99"), 300: _stat(1, 300, "30")}
    assert reaper.targets(table) == {200, 300, 250, 301}
    # a spared session (the launcher's) is never a target, even when a child joined it
    spared = child.Reaper(spare={100})
    spared.add(700, 100)
    assert spared.targets({700: _stat(100, 100, "70"), 701: _stat(1, 100, "71")}) == {700}


def test_run_kills_its_child_on_timeout_and_checks():
    with pytest.raises(subprocess.TimeoutExpired):
        child.run([sys.executable, "-c", "import time; time.sleep(600)"], timeout=1)
    with pytest.raises(subprocess.CalledProcessError):
        child.run([sys.executable, "-c", "raise SystemExit(3)"], check=True)
    done = child.run([sys.executable, "-c", "print('ok')"], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "ok\n")


# ----------------------------------------------------------- slow: the real commands
def _tiny_yaml(tmp_path: Path) -> Path:
    """A run long enough to be killed in the middle: 200 rounds of 2 clients."""
    return tiny_run_yaml(tmp_path, "tiny.yaml", rounds=200, clients=2, **{
        "fraction-fit": 1.0, "eval-every": 1, "checkpoint-every": 0,
        "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 2000}})


def _cli(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([str(Path(sys.executable).parent / "flower-pfl"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=cwd, env=_env(), start_new_session=True)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _kill_mid_run(launcher: subprocess.Popen, working: str, want: tuple[str, ...],
                  why=lambda: "") -> tuple[set[tuple[int, str]], list[str]]:
    """Collect ``launcher``'s process tree until a process whose command line holds
    ``working`` runs in it (a round is in progress), SIGKILL the launcher, and return the
    tree (every process seen, by PID and start time) and what of it is left after the
    bound.  ``want``: command-line fragments the tree must have held (what is checked);
    ``why()``: what to add to the message when no round starts."""
    output: list[str] = []
    threading.Thread(target=lambda: output.extend(launcher.stdout), daemon=True).start()
    seen: set[tuple[int, str]] = set()
    names: set[str] = set()
    deadline = time.time() + 300
    try:
        while True:
            assert launcher.poll() is None, "".join(output[-40:])
            assert time.time() < deadline, f"no round started: {why()}" + "".join(output[-40:])
            tree = process_tree(launcher.pid) | {launcher.pid}
            seen |= {i for i in map(_identity, tree) if i is not None}
            running = {pid: _cmdline(pid) for pid in tree}
            names |= set(running.values())
            if any(working in cmd for cmd in running.values()):
                break
            time.sleep(0.2)
    finally:
        launcher.kill()  # also when the test fails: its reaper stops the rest
        launcher.wait()
    left = _left_after_bound(seen)  # first: a failing check below leaves nothing running
    for fragment in want:
        assert any(fragment in n for n in names), (fragment, sorted(names))
    return seen, left


@pytest.mark.slow  # a real SuperLink, a real `flower-pfl supernode`, a run
def test_sigkilled_supernode_leaves_no_process(tmp_path):
    from flower_pfl.running.deploy import Deployment

    with Deployment(tmp_path / "work", 2, None) as dep:
        dep.start_superlink()
        dep.start_node(dep.add_node(1))  # the other client, started by the test
        node = _cli("supernode", "--superlink", f"127.0.0.1:{dep.port}", "--insecure",
                    "--partition-id", "0", "--num-partitions", "1", "--port", str(free_port()),
                    "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
        run_ended: list[object] = []

        def serve() -> None:  # the run's ServerApp waits for the node, then runs rounds
            try:
                run_ended.append(dep.run(_tiny_yaml(tmp_path), [], tmp_path / "res",
                                         timeout_s=900))
            except Exception as exc:  # noqa: BLE001 - ends when the node is gone / closed
                run_ended.append(exc)
        threading.Thread(target=serve, daemon=True).start()
        seen, left = _kill_mid_run(node, "flwr-clientapp",
                                   ("flower-supernode", "flower-superexec", "flwr-clientapp",
                                    "reaper_main"), why=lambda: repr(run_ended))
    assert len(seen) >= 5 and left == [], left


@pytest.mark.slow  # a real `flower-pfl deploy`: a SuperLink and two SuperNodes
def test_sigkilled_deploy_leaves_no_process(tmp_path):
    launcher = _cli("deploy", "--insecure", "--config", str(_tiny_yaml(tmp_path)), cwd=tmp_path)
    seen, left = _kill_mid_run(launcher, "flwr-clientapp",
                               ("flower-superlink", "flower-supernode", "flwr-serverapp",
                                "flwr-clientapp", "flwr run", "reaper_main"))
    assert len(seen) >= 9 and left == [], left


@pytest.mark.slow  # a real `flower-pfl run`: SuperLink, SuperExec, Ray
def test_sigkilled_run_leaves_no_process(tmp_path):
    launcher = _cli("run", "--config", str(_tiny_yaml(tmp_path)), cwd=tmp_path)
    seen, left = _kill_mid_run(launcher, "ray::ClientAppActor",
                               ("flower-superlink", "flower-superexec", "flwr-simulation",
                                "raylet", "gcs_server", "flwr run", "reaper_main"))
    assert len(seen) >= 10 and left == [], left


@pytest.mark.slow  # a real `ray start --head` (a bench's shared Ray instance)
def test_sigkilled_bench_leaves_no_shared_ray_process(tmp_path):
    """``flower-pfl bench --ray shared``: `ray start --head` exits and leaves its daemons
    re-parented to init; they are in its session, which the reaper stops."""
    from flower_pfl.running.procs import pids_naming

    work = Path(tempfile.mkdtemp(prefix="fpl-orph-", dir="/tmp"))  # Ray's socket path limit
    script = tmp_path / "bench_ray.py"
    script.write_text(textwrap.dedent(f"""
        import time
        from pathlib import Path
        from flower_pfl.running.rayhead import shared_ray
        with shared_ray(Path({str(work)!r}), Path({str(tmp_path / "ray.log")!r})) as address:
            print(address, flush=True)
            time.sleep(600)
    """))
    launcher = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                text=True, cwd=tmp_path, env=_env(), start_new_session=True)
    try:
        assert launcher.stdout.readline().strip(), (tmp_path / "ray.log").read_text()
        named = pids_naming(str(work / "ray"))
        tree = set().union({launcher.pid}, named, *(process_tree(p) for p in named),
                           process_tree(launcher.pid))
        seen = {i for i in map(_identity, tree) if i is not None}
        names = " ".join(_cmdline(p) for p in tree)
    finally:
        launcher.kill()
        launcher.wait()
    left = _left_after_bound(seen)
    shutil.rmtree(work, ignore_errors=True)
    assert left == [], left
    assert "gcs_server" in names and "raylet" in names and "reaper_main" in names, names
    assert len(seen) >= 5
