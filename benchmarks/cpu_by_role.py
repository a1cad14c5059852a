"""Where the machine's cores go during a simulation's rounds, process role by role.

A round of ``s`` seconds on a machine of ``C`` cores has ``C x s`` core-seconds.  While a
``flower-pfl run`` goes, :class:`CpuClock` watches its ``rounds.csv`` (every 20 ms); when a
round's row arrives it reads the CPU time (user + system, /proc/PID/stat) of every process
on the machine.  Between the end of round 1 and the end of the last round it charges each
process' CPU time to its role (:func:`sim_memory.role`: the ClientApp actors, the
simulation process that runs the ServerApp and the engine, the SuperLink, Ray's daemons,
the launcher, ``flwr run``; everything else on the machine is ``not the run``) and divides
by the rounds: core-seconds per round, role by role, and what nobody used (``idle``).

The training steps of the two-worker limit need the actors' share only; what the other
roles take is CPU the actors cannot have on a 2-core machine.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_memory import Poller, cmdline, role  # noqa: E402 - benchmarks/

from flower_pfl.running.procs import proc_stats  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> dict[int, float]:
    """user + system CPU seconds of every process now on the machine."""
    return {pid: (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
            for pid, fields in proc_stats().items() if len(fields) > 12}


def machine_busy_s() -> float:
    """Non-idle CPU seconds of the whole machine since boot (/proc/stat's first line)."""
    with open("/proc/stat") as fh:
        parts = [int(x) for x in fh.readline().split()[1:]]
    idle = parts[3] + parts[4]  # idle, iowait
    return (sum(parts[:8]) - idle) / TICK


#: Ray's daemons, each on its own row (needle in the command line -> row)
RAY_DAEMONS = (("gcs_server", "ray: gcs_server"), ("raylet/raylet", "ray: raylet"),
               ("runtime_env", "ray: runtime_env agent"),
               ("dashboard/agent", "ray: dashboard agent"),
               ("dashboard/dashboard", "ray: dashboard"), ("log_monitor", "ray: log_monitor"),
               ("monitor.py", "ray: monitor"))


def role_of(pid: int, launcher: int | None) -> str:
    if pid == os.getpid():
        return "benchmark"
    text = cmdline(pid)
    if launcher is None and "flower_pfl.cli run" in text:
        return "launcher"
    name = role(pid, launcher if launcher is not None else -1, text)
    if name == "ray-daemons":
        return next((row for needle, row in RAY_DAEMONS if needle in text), "ray: other")
    return "not the run" if name == "other" else name


class CpuClock(Poller):
    """Snapshots every process' CPU time when each round's row reaches ``rounds.csv``."""

    def __init__(self, run_dir: Path, launcher: int | None = None) -> None:
        super().__init__(0.02)
        self.rounds_csv = run_dir / "rounds.csv"
        self.launcher = launcher
        self.size = 0
        self.snaps: list[tuple[float, float, dict[int, float]]] = []  # (t, busy, cpu by pid)
        self.roles: dict[int, str] = {}

    def poll(self) -> None:
        try:
            size = self.rounds_csv.stat().st_size
        except OSError:
            return
        if size <= self.size:
            return
        self.size = size
        with open(self.rounds_csv, "rb") as fh:
            rows = [ln for ln in fh.read().split(b"\n")[1:] if ln[:1].isdigit()]
        while len(self.snaps) < len(rows):  # one snapshot per round (a late poll: the same)
            cpu = cpu_seconds()
            self.snaps.append((time.perf_counter(), machine_busy_s(), cpu))
            for pid in cpu:
                if pid not in self.roles or self.roles[pid] in ("ray-idle", "not the run"):
                    self.roles[pid] = role_of(pid, self.launcher)  # workers rename themselves

    def per_round(self, cores: int | None = None) -> dict[str, float] | None:
        """Core-seconds per round by role between the first and the last round's end, with
        ``wall`` (seconds per round), ``idle`` (cores x wall - every process' CPU) and
        ``machine`` (the machine's busy seconds from /proc/stat, a cross-check)."""
        if len(self.snaps) < 2:
            return None
        (t0, busy0, first), (t1, busy1, last) = self.snaps[0], self.snaps[-1]
        rounds = len(self.snaps) - 1
        out: dict[str, float] = {}
        for pid, cpu in last.items():
            used = cpu - first.get(pid, 0.0)
            if used > 0:
                key = self.roles.get(pid, "not the run")
                out[key] = out.get(key, 0.0) + used / rounds
        wall = (t1 - t0) / rounds
        total = sum(out.values())
        out["wall"] = wall
        out["idle"] = (cores or os.cpu_count() or 1) * wall - total
        out["machine"] = (busy1 - busy0) / rounds
        return out


ORDER = ["actor", "serverapp", "superlink", "superexec", "flwr-run", "launcher",
         *(row for _, row in RAY_DAEMONS), "ray: other", "ray-idle", "benchmark",
         "not the run", "idle"]


def table(arms: dict[str, dict[str, float]], cores: int | None = None) -> str:
    """A markdown table: core-seconds per round by role (rows) for each arm (columns)."""
    cores = cores or os.cpu_count() or 1
    names = list(arms)
    keys = [k for k in ORDER if any(k in a for a in arms.values())]
    keys += sorted({k for a in arms.values() for k in a} - set(keys) - {"wall", "machine"})
    lines = ["| core-s per round | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names)]
    for key in keys:
        cells = [f"{a.get(key, 0.0):.3f} ({a.get(key, 0.0) / (cores * a['wall']):.0%})"
                 for a in arms.values()]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines.append(f"| = {cores} cores x s/round | "
                 + " | ".join(f"{cores * a['wall']:.3f}" for a in arms.values()) + " |")
    lines.append("| machine busy (/proc/stat) | "
                 + " | ".join(f"{a['machine']:.3f}" for a in arms.values()) + " |")
    return "\n".join(lines)
