"""``flower-pfl``: validate a config and run it in Ray simulation, then clean up.

    flower-pfl run [--config simulation.yaml] [--set key=value ...]
    flower-pfl validate [--config FILE] [--set key=value ...]
    flower-pfl strategies

``run`` is the one source of truth for the client count: it validates the YAML first
(one clear error, nothing started), starts a private SuperLink (its own FLWR_HOME and
loopback port, runtime dependency installation off), calls ``flwr run`` with
``num-supernodes`` and client resources taken from the YAML, checks the run's FINAL
status (``flwr run --stream`` exits 0 even when the run failed) and stops every process
it started -- SuperLink, SuperExec, ServerApp, Ray -- by PID, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from flower_pfl import config as config_mod
from flower_pfl import registry

APP_DIR = Path(__file__).resolve().parent.parent


class LaunchError(RuntimeError):
    pass


# ------------------------------------------------------------------------ processes
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, session id), from /proc (Linux)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            table[int(entry)] = (int(fields[1]), int(fields[3]))
        except (OSError, IndexError, ValueError):
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


def stop_tree(pids: set[int], grace_s: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL whatever is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.time() < deadline:
            alive = {p for p in pids if _alive(p)}
            if not alive:
                return
            time.sleep(0.2)
        pids = alive


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class ProcessSet:
    """Processes this launcher started; ``stop()`` ends them and all their descendants."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.known: set[int] = set()

    def start(self, cmd: Sequence[str], env: dict, log_path: Path) -> subprocess.Popen:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(list(cmd), env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
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


def flwr_env(flwr_home: Path, port: int) -> dict:
    env = os.environ.copy()
    bin_dir = str(Path(sys.executable).parent)  # flower-superexec etc. live beside python
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["FLWR_HOME"] = str(flwr_home)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(port)
    env["FLWR_LOCAL_CONTROL_API_PORT"] = str(port)
    env.setdefault("RAY_DEDUP_LOGS", "0")
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


def _bin(name: str) -> str:
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else (shutil.which(name) or name)


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None,
              cafile: str | None = None) -> None:
    import ssl

    handlers: list = [urllib.request.ProxyHandler({})]  # loopback: never via a proxy
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


@contextmanager
def simulation_superlink(workdir: Path, log_path: Path) -> Iterator[tuple[dict, ProcessSet]]:
    """A private simulation SuperLink on a free loopback port; stopped on exit."""
    flwr_home = workdir / "flwr-home"
    flwr_home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = flwr_env(flwr_home, port)
    procs = ProcessSet()
    try:
        proc = procs.start([_bin("flower-superlink"), "--insecure", "--simulation",
                            "--isolation", "subprocess", "--host", "127.0.0.1", "--port", str(port),
                            "--disable-runtime-dependency-installation"],
                           env, log_path)
        wait_http(f"http://127.0.0.1:{port}/health", 120, proc)
        yield env, procs
    finally:
        procs.stop()


# ---------------------------------------------------------------------------- runs
def toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid TOML basic string


def run_status(run_id: str, env: dict) -> str:
    out = subprocess.run([_bin("flwr"), "ls", "--run-id", run_id, "--format", "json"],
                         env=env, capture_output=True, text=True, timeout=60)
    try:
        runs = json.loads(out.stdout).get("runs", [])
    except json.JSONDecodeError as exc:
        raise LaunchError(f"could not read the run's status: {out.stdout[-500:]}"
                          f"{out.stderr[-500:]}") from exc
    return runs[0]["status"] if runs else "unknown"


@dataclass
class RunOutcome:
    status: str
    run_id: str | None
    pids: set[int]  # every process the run started (all stopped when this returns)


def run_simulation(cfg: config_mod.RunConfig, config_path: Path, overrides: Sequence[str],
                   results_dir: Path, app_dir: Path = APP_DIR, timeout_s: float | None = None,
                   echo: bool = True, num_supernodes: int | None = None) -> RunOutcome:
    """Run ``cfg`` through ``flwr run`` in Ray simulation and stop everything it started.

    ``num_supernodes`` defaults to the YAML's ``clients`` (only tests set another value).
    Raises LaunchError if the run did not reach ``finished:completed``.
    """
    results_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="flower-pfl-"))
    run_config = workdir / "run-config.toml"
    run_config.write_text(
        f"config-file = {toml_string(str(config_path.resolve()))}\n"
        f"overrides = {toml_string(' '.join(overrides))}\n"
        f"results-dir = {toml_string(str(results_dir.resolve()))}\n")
    federation = (f"num-supernodes={num_supernodes or cfg['clients']} "
                  f"client-resources-num-cpus={cfg['client-resources.num-cpus']} "
                  f"client-resources-num-gpus={cfg['client-resources.num-gpus']}")
    log_path = results_dir / "flwr-run.log"
    try:
        with simulation_superlink(workdir, results_dir / "superlink.log") as (env, procs):
            cmd = [_bin("flwr"), "run", str(app_dir), "local", "--stream",
                   "--federation-config", federation, "--run-config", str(run_config)]
            run_id = _stream(cmd, env, log_path, echo, timeout_s, procs)
            status = run_status(run_id, env) if run_id else "unknown"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if status != "finished:completed":
        raise LaunchError(f"run {run_id or '?'} ended with status '{status}'; see {log_path}")
    return RunOutcome(status, run_id, set(procs.known))


def _stream(cmd: list[str], env: dict, log_path: Path, echo: bool, timeout_s: float | None,
            procs: ProcessSet, on_line=None) -> str | None:
    """Run ``flwr run --stream``, tee its output, return the run id; ``on_line(line)`` is
    called for every line (tests use it to act at a given round)."""
    run_id = None
    last_snapshot = 0.0
    deadline = None if timeout_s is None else time.time() + timeout_s
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        procs.procs.append(proc)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
            match = re.search(r"Successfully started run (\d+)", line)
            if match:
                run_id = match.group(1)
            if on_line is not None:
                on_line(line)
            if time.time() - last_snapshot > 1.0:  # a /proc scan, at most once a second
                procs.snapshot()  # remember ServerApp/Ray PIDs while they are alive
                last_snapshot = time.time()
            if deadline is not None and time.time() > deadline:
                raise LaunchError(f"run exceeded {timeout_s:.0f}s; see {log_path}")
        proc.wait()
    return run_id


# ----------------------------------------------------------------------------- CLI
def _load(args) -> config_mod.RunConfig:
    return config_mod.load(Path(args.config), args.set or None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flower-pfl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "validate"):
        p = sub.add_parser(name)
        p.add_argument("--config", default=str(APP_DIR / "simulation.yaml"),
                       help="the run's YAML file (default: the app's simulation.yaml)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override one key for this run (repeatable), e.g. --set rounds=5")
        if name == "run":
            p.add_argument("--timeout", type=float, default=None, help="seconds before giving up")
            p.add_argument("--quiet", action="store_true", help="do not echo Flower's log")
    sub.add_parser("strategies")
    p = sub.add_parser("certs", help="make a throwaway CA + server certificate (testing)")
    p.add_argument("dir")
    p.add_argument("--host", action="append", help="host names/IPs of the SuperLink "
                   "(default: 127.0.0.1 localhost ::1)")
    p = sub.add_parser("node-key", help="make an EC key pair for SuperNode authentication")
    p.add_argument("dir")
    p.add_argument("name")
    p = sub.add_parser("deploy", help="SuperLink + one SuperNode per client on this machine")
    p.add_argument("--config", default=str(APP_DIR / "simulation.yaml"))
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
    p.add_argument("--certs", help="folder with ca.crt, server.pem, server.key")
    p.add_argument("--insecure", action="store_true", help="no TLS, no node auth (testing)")
    p.add_argument("--gpus", default="", help="comma-separated GPU ids, round-robin per node")
    p.add_argument("--data-root", default=None)
    p.add_argument("--timeout", type=float, default=None)
    args = parser.parse_args(argv)

    if args.command == "certs":
        from flower_pfl.deploy import make_ca

        paths = make_ca(args.dir, args.host or ("127.0.0.1", "localhost", "::1"))
        print("\n".join(f"{k}: {v}" for k, v in paths.items()))
        return 0
    if args.command == "node-key":
        from flower_pfl.deploy import make_node_key

        private, public = make_node_key(args.dir, args.name)
        print(f"private: {private}\npublic:  {public}")
        return 0

    if args.command == "strategies":
        for entry in registry.REGISTRY.values():
            print(f"{entry.name:12s} {entry.summary}")
            for key, h in entry.hyper.items():
                print(f"{'':14s}{key} = {h.default!r}: {h.doc}")
        return 0
    try:
        cfg = _load(args)
    except config_mod.ConfigError as exc:
        print(f"flower-pfl: {exc}", file=sys.stderr)
        return 2
    if args.command == "validate":
        print(f"{args.config}: OK (strategy {cfg.strategy}, {cfg['clients']} clients, "
              f"{cfg['rounds']} rounds)")
        return 0
    if args.command == "deploy":
        from flower_pfl.deploy import deploy
        from strategies.base import default_results_dir

        if not args.certs and not args.insecure:
            print("flower-pfl: deploy needs --certs DIR (TLS + node auth) or --insecure",
                  file=sys.stderr)
            return 2
        results_dir = default_results_dir(cfg)
        try:
            deploy(Path(args.config), args.set or [], results_dir, cfg["clients"],
                   None if args.insecure else Path(args.certs),
                   [g for g in args.gpus.split(",") if g], args.data_root, args.timeout)
        except LaunchError as exc:
            print(f"flower-pfl: FAILED: {exc}", file=sys.stderr)
            return 1
        print(f"flower-pfl: deployment run completed. Results: {results_dir}")
        return 0
    from strategies.base import default_results_dir

    results_dir = default_results_dir(cfg)
    print(f"flower-pfl: {cfg.strategy} on {cfg['data.dataset']}/{cfg['data.partition']}, "
          f"{cfg['clients']} clients, {cfg['rounds']} rounds -> {results_dir}", flush=True)
    try:
        run_simulation(cfg, Path(args.config), args.set or [], results_dir,
                       timeout_s=args.timeout, echo=not args.quiet)
    except LaunchError as exc:
        print(f"flower-pfl: FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("flower-pfl: interrupted; processes stopped", file=sys.stderr)
        return 130
    print(f"flower-pfl: run completed. Results: {results_dir}/rounds.csv (per round), "
          f"{results_dir}/clients.csv (per client), {results_dir}/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
