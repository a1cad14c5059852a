"""Memory of a Ray simulation, process by process (docs/BENCHMARKS.md, "Simulation memory").

Runs the workload through ``flower-pfl run`` (this checkout's CLI, a private SuperLink and
Ray instance) once per arm, one arm after another, and samples every ``--interval`` seconds:

* the machine: ``MemTotal - MemAvailable`` (/proc/meminfo); the idle baseline is its median
  over ``--idle-s`` seconds before the first arm, and the figure reported is its peak during
  the arm minus that baseline (what the run costs the machine, page cache excluded);
* every process of the run -- the launcher and its process tree with their sessions
  (:func:`flower_pfl.running.procs.process_tree`: SuperLink, SuperExec, ``flwr run``, the
  simulation process that runs the ServerApp, Ray's GCS/raylet/agents and the ClientApp
  actors) -- its PSS and USS (Private_Clean + Private_Dirty) from /proc/PID/smaps_rollup,
  grouped by role (:func:`role`).  PSS splits shared pages (torch's libraries mapped by
  several processes) among them, so the summed PSS is the processes' real share.

Printed per arm: the peak of the summed PSS, the peak PSS and USS per role (each Ray actor
on its own row), seconds per round (median of the round-to-round differences of the run's
summary.json) and, from the second arm on, the ratios to the first arm (the reference).

Workload (issue 29's): FMNIST DNN, pathological 2 classes per client, 20 clients all sampled,
batch 10, 1 local epoch, ``--rounds`` rounds, every client evaluates every round.  An arm is
``NAME`` or ``NAME:key=value,key=value`` (YAML keys, dotted); NAME alone is a strategy.
``@tree=DIR`` runs that arm from another copy of the project (a snapshot taken before a
change: before and after in one run).  The run's environment is the user's without
OMP_NUM_THREADS/MKL_NUM_THREADS (``quiet`` sets them): Ray then gives each actor its
``client-resources.num-cpus`` threads, as in a user's run.

    .venv/bin/python benchmarks/sim_memory.py --rounds 5 \
        --arm fedavg --arm fedamp --arm fedavg-2actors:strategy=fedavg,client-resources.num-cpus=1

Every process the launcher started is stopped by the launcher itself; whatever this script
saw that is still alive afterwards (a crash, Ctrl-C) is stopped by PID and reported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim_overhead import workload  # noqa: E402 - benchmarks/, this script's directory

from flower_pfl.running.procs import is_alive, process_tree, stop_tree  # noqa: E402


def parse_arm(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition(":")
    sets = dict(kv.split("=", 1) for kv in rest.split(",") if kv) if rest else {}
    return name, sets or {"strategy": name}


def set_key(tree: dict, dotted: str, value: str) -> None:
    *path, last = dotted.split(".")
    for key in path:
        tree = tree.setdefault(key, {})
    tree[last] = yaml.safe_load(value)


def used_kb() -> int:
    """MemTotal - MemAvailable: memory the machine cannot hand out without swapping."""
    info = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            key, value = line.split(":")
            info[key] = int(value.split()[0])
    return info["MemTotal"] - info["MemAvailable"]


def pss_uss_kb(pid: int) -> tuple[int, int]:
    pss = uss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                elif line.startswith(("Private_Clean:", "Private_Dirty:")):
                    uss += int(line.split()[1])
    except OSError:
        pass
    return pss, uss


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def role(pid: int, launcher: int, cmd: str) -> str:
    """Which part of the run ``pid`` is (from its command line ``cmd``; Ray renames its
    workers: ``default_worker.py`` -> ``ray::IDLE`` -> ``ray::ClientAppActor``)."""
    if pid == launcher:
        return "launcher"
    for needle, name in (("flower-superlink", "superlink"), ("flower-superexec", "superexec"),
                         ("flwr-simulation", "serverapp"), ("initial_arrays", "serverapp-init"),
                         ("preflight_child", "launcher-preflight"),
                         ("gcs_server", "ray-daemons"), ("raylet/raylet", "ray-daemons"),
                         ("ray/dashboard", "ray-daemons"), ("Agent", "ray-daemons"),
                         ("ray/_private", "ray-daemons"), ("ray/autoscaler", "ray-daemons"),
                         ("ClientAppActor", "actor"), ("ray::IDLE", "ray-idle"),
                         ("default_worker.py", "ray-idle")):
        if needle in cmd:
            return name
    if " run " in cmd and "bin/flwr " in cmd.split(" run ")[0] + " ":
        return "flwr-run"
    return "other"


class Poller:
    """Calls :meth:`poll` every ``interval_s`` on a thread while in a ``with`` block, and
    once more on leaving it (so the last state is seen)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            time.sleep(self.interval_s)

    def poll(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.poll()


class Sampler(Poller):
    """Samples the machine's used memory (every poll) and every process of the run (every
    ``pss_every``-th poll and the last: reading each process' smaps_rollup costs the
    sampler CPU that a timed run on 2 cores then lacks) on a thread."""

    def __init__(self, launcher: int, interval_s: float, pss_every: int = 1) -> None:
        super().__init__(interval_s)
        self.launcher = launcher
        self.pss_every = max(1, pss_every)
        self.polls = 0
        self.seen: set[int] = set()
        self.roles: dict[int, str] = {}
        self.names: dict[int, str] = {}  # pid -> its command line (the last one seen)
        self.peak_pid: dict[int, int] = {}  # pid -> its peak PSS (kB)
        self.peak_used = 0
        self.peak_pss = (0, 0)  # (kb, processes)
        self.peak_role: dict[str, tuple[int, int]] = {}  # role or "actor <pid>" -> (pss, uss)

    def poll(self) -> None:
        self.peak_used = max(self.peak_used, used_kb())
        self.polls += 1
        if (self.polls - 1) % self.pss_every and not self.stop.is_set():
            return
        pids = process_tree(self.launcher) if is_alive(self.launcher) else set()
        self.seen |= pids
        sums: dict[str, list[int]] = {}
        total = 0
        for pid in pids:
            pss, uss = pss_uss_kb(pid)
            self.peak_pid[pid] = max(pss, self.peak_pid.get(pid, 0))
            text = cmdline(pid)
            if text or pid not in self.roles:  # Ray's workers rename themselves: IDLE, actor
                self.roles[pid] = role(pid, self.launcher, text)
                self.names[pid] = text.strip()[:110]
            name = self.roles[pid]
            keys = [name] + ([f"actor {pid}"] if name == "actor" else [])
            for key in keys:
                acc = sums.setdefault(key, [0, 0])
                acc[0] += pss
                acc[1] += uss
            total += pss
        if total > self.peak_pss[0]:
            self.peak_pss = (total, len(pids))
        for key, (pss, uss) in sums.items():
            old = self.peak_role.get(key, (0, 0))
            self.peak_role[key] = (max(old[0], pss), max(old[1], uss))


def run_arm(name: str, tree: dict, out: Path, idle_kb: int, interval_s: float,
            timeout_s: float, app: Path = ROOT, watch=None, pss_every: int = 1) -> dict:
    """One ``flower-pfl run`` of ``tree`` under the memory :class:`Sampler` (the processes'
    PSS every ``pss_every``-th sample); ``watch``: an optional context manager (given the
    run's results folder) around the run, e.g. a thread timing its rounds."""
    tree = json.loads(json.dumps(tree))
    tree["run-name"] = name
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    cmd = [sys.executable, "-m", "flower_pfl.cli", "run", "--config", str(path), "--quiet"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["PYTHONPATH"] = str(app)  # the launcher imports this copy (its app is this folder)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=app, env=env)
    sampler = Sampler(proc.pid, interval_s, pss_every)
    try:
        with sampler, (watch(out / name) if watch else contextlib.nullcontext()):
            output, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
        left = {p for p in sampler.seen if p != proc.pid and is_alive(p)}
        if left:  # the launcher stops its processes; anything left is stopped here, by PID
            print(f"  {name}: stopping {len(left)} process(es) left behind: {sorted(left)}")
            stop_tree(left)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"arm {name} failed:\n{output[-3000:]}")
    rows = json.loads((out / name / "summary.json").read_text())["rounds"]
    diffs = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
    mb = 1 / 1024
    return {"s_per_round": statistics.median(diffs) if diffs else None,
            "wall_s": round(wall, 1),
            "above_idle_mb": round((sampler.peak_used - idle_kb) * mb),
            "peak_pss_mb": round(sampler.peak_pss[0] * mb), "processes": sampler.peak_pss[1],
            "roles": {k: (round(p * mb), round(u * mb))
                      for k, (p, u) in sorted(sampler.peak_role.items())},
            "processes_seen": {pid: f"{sampler.peak_pid.get(pid, 0) // 1024:>5} MB "
                                    f"{sampler.roles[pid]}: {sampler.names.get(pid, '')}"
                               for pid in sorted(sampler.roles)}}


def idle_baseline(seconds: float) -> int:
    samples = []
    end = time.time() + seconds
    while time.time() < end:
        samples.append(used_kb())
        time.sleep(0.25)
    return int(statistics.median(samples))


def report(name: str, res: dict, ref: dict | None, verbose: bool = False) -> None:
    print(f"\n== {name}: {res['s_per_round']:.2f} s/round, wall {res['wall_s']} s; above idle "
          f"(peak MemTotal-MemAvailable - idle) {res['above_idle_mb']} MB; peak summed PSS "
          f"{res['peak_pss_mb']} MB over {res['processes']} processes")
    if ref is not None:
        print(f"   vs {ref['name']}: s/round x{res['s_per_round'] / ref['s_per_round']:.2f}, "
              f"above idle x{res['above_idle_mb'] / max(ref['above_idle_mb'], 1):.2f}, "
              f"summed PSS x{res['peak_pss_mb'] / max(ref['peak_pss_mb'], 1):.2f}")
    print(f"   {'role (peak over the run)':<28}{'PSS MB':>8}{'USS MB':>8}")
    for key, (pss, uss) in res["roles"].items():
        print(f"   {key:<28}{pss:>8}{uss:>8}")
    if verbose:
        for pid, text in res["processes_seen"].items():
            print(f"   {pid:>8} {text}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--subsample", type=int, default=None, help="pooled images (default: all)")
    p.add_argument("--arm", action="append", default=[], metavar="NAME[:key=v,...]")
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--idle-s", type=float, default=5.0)
    p.add_argument("--timeout", type=float, default=600.0, help="per arm, seconds")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--verbose", action="store_true", help="list every process and its role")
    args = p.parse_args()
    arms = [parse_arm(a) for a in (args.arm or ["fedavg"])]
    print(f"load average before: {os.getloadavg()}", flush=True)
    idle = idle_baseline(args.idle_s)
    print(f"idle baseline (MemTotal-MemAvailable): {idle / 1024:.0f} MB", flush=True)
    results, ref = {}, None
    with tempfile.TemporaryDirectory(prefix="sim-memory-") as tmp:
        for name, sets in arms:
            tree = workload(args.rounds, args.subsample, Path(tmp))
            app = Path(sets.pop("@tree", ROOT)).resolve()
            for key, value in sets.items():
                set_key(tree, key, value)
            res = run_arm(name, tree, Path(tmp), idle, args.interval, args.timeout, app)
            res["name"], res["sets"] = name, sets
            results[name] = res
            report(name, res, ref, args.verbose)
            ref = ref or res
            sys.stdout.flush()
    print(f"\nload average after: {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"idle_mb": idle / 1024, "arms": results},
                                              indent=1))


if __name__ == "__main__":
    main()
