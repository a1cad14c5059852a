"""One Ray instance for a whole bench (``flower-pfl bench --ray shared``).

Each ``flwr run`` in simulation starts and stops a Ray instance of its own (seconds per
run, docs/BENCHMARKS.md). :func:`shared_ray` starts ONE (``ray start --head``) that every
cell's simulation attaches to through ``RAY_ADDRESS`` (Flower's Ray backend calls
``ray.init()`` without an address, which honours the variable), and stops it by PID --
never ``ray stop``, which ends every Ray process on the machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from flower_pfl.running.procs import (
    LaunchError,
    free_port,
    is_alive,
    pids_naming,
    process_tree,
    run,
    stop_tree,
)

# Ray puts its AF_UNIX sockets at <temp-dir>/session_<date>_<time>_<pid>/sockets/plasma_store
# (~65 bytes below the temp dir) and refuses paths over 107 bytes.
RAY_SOCKET_SUFFIX = "/session_2026-11-26_18-17-47_329120_4194304/sockets/plasma_store"
# Where ray_temp_dir puts the shared instance when workdir/ray is too long for its sockets.
RAY_SHORT_TMP_DIR, RAY_SHORT_TMP_PREFIX = "/tmp", "fplray-"


def ray_temp_dir(workdir: Path) -> Path:
    """Ray's --temp-dir for the shared instance: ``workdir/ray`` where its socket paths fit
    Linux's 107-byte limit, else a new short folder under /tmp (a long TMPDIR made
    `ray start --head` fail: "AF_UNIX path length cannot exceed 107 bytes")."""
    tmp = workdir / "ray"
    if len(str(tmp) + RAY_SOCKET_SUFFIX) > 107:
        tmp = Path(tempfile.mkdtemp(prefix=RAY_SHORT_TMP_PREFIX, dir=RAY_SHORT_TMP_DIR))
    return tmp


@contextmanager
def shared_ray(workdir: Path, log_path: Path) -> Iterator[str]:
    """One Ray instance (``ray start --head``) for every cell of the bench; yields its address.

    Stopped by PID on exit: the processes that name its temp dir (:func:`ray_temp_dir`) on
    their command line, with their descendants and sessions."""
    ray_bin = str(Path(sys.executable).parent / "ray")
    tmp = ray_temp_dir(workdir)
    port = free_port()
    import ray._private.services as services  # the address Ray itself would bind

    ip = services.get_node_ip_address()
    cmd = [ray_bin, "start", "--head", f"--node-ip-address={ip}", f"--port={port}",
           f"--num-cpus={os.cpu_count() or 1}", "--num-gpus=0", "--include-dashboard=false",
           f"--temp-dir={tmp}", "--disable-usage-stats"]
    env = dict(os.environ, RAY_DISABLE_USAGE_STATS="1")
    try:
        with open(log_path, "ab") as log:
            try:
                # its own session: `ray start` exits and leaves its daemons there, where the
                # reaper (flower_pfl.child) finds them should this process be killed
                run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=300,
                    session=True)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                raise LaunchError(f"`ray start --head` failed ({exc}); see {log_path}") from exc
        yield f"{ip}:{port}"
    finally:
        # the processes naming the temp dir (GCS, raylet) and their descendants and sessions:
        # the agents and workers rename themselves (ray::DashboardAgent, ...) and were left
        # behind when only the named ones were stopped
        named = {p for p in pids_naming(str(tmp)) if p != os.getpid()}
        ours = set().union(named, *(process_tree(p) for p in named))
        stop_tree(ours)
        current = Path("/tmp/ray/ray_current_cluster")
        try:
            if f":{port}" in current.read_text():
                current.unlink()  # do not leave a stale pointer to a cluster that is gone
        except OSError:
            pass
        assert not any(is_alive(p) for p in ours)
        shutil.rmtree(tmp, ignore_errors=True)
