"""Ray simulation across hosts: ``flower-pfl run --ray-address`` on a three-host Ray cluster.

Three network namespaces on a bridge with private addresses (:class:`tests.netns.Net`): the
head (``ray start --head --num-cpus=0``: no client actor fits there) and two workers
(``ray start --address=<head>:6379 --num-cpus=1``), each node with its own ``--temp-dir``
(never the machine's /tmp/ray) and the test's environment (the FMNIST cache: a Ray worker
gets its environment from its node's ``ray start``, not from the driver).
``flower-pfl run`` runs in the HEAD's namespace: its private SuperLink listens on the
head's loopback and Flower's simulation process -- the Ray driver, which also runs the
ServerApp -- joins the cluster there (a driver must reach the GCS and every node, and
every node must reach the driver back: the head is where Ray's own docs put it).

Asserted: the launcher names the cluster and Flower's simulation process reports 3 nodes
and 2 CPUs; every fit ran on one of the two workers and both were used (fit.csv's
``ray_node``/``ray_node_ip``, the node ids the workers' raylets logged); the per-client
metrics (clients.csv, fit.csv) equal those of a single-machine run of the same
configuration and seed bit for bit -- only the Ray node columns differ, as they must (the
single-machine run's node is this machine's private Ray instance); afterwards no process
in any namespace, no namespace or link, no process naming a node's temp dir. The cluster is
stopped by PID (every process in each namespace), never ``ray stop``: it ends every Ray
process of the machine, in any namespace. Needs root and ``ip netns`` (skipped otherwise).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from flower_pfl.running.procs import pids_naming, stop_tree
from tests.netns import Net, empty_ns, namespaces, ns_pids, root_links, sweep_stale

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
PORT = 6379
RUN = {"strategy": "fedamp", "rounds": 2, "clients": 4, "fraction-fit": 1.0, "model": "mclr",
       "seed": 0, "round-timeout": 120,
       "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 3000}}
NODE_COLUMNS = {"ray_node", "ray_node_ip"}


def _rows(path: Path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def _only_run(output_dir: Path) -> Path:
    runs = [p for p in output_dir.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def _run(argv: list[str], cwd: Path, env: dict, timeout_s: float = 900) -> str:
    """Run a command to its end; past ``timeout_s`` it gets SIGTERM first (flower-pfl run
    then stops everything it started, by PID), SIGKILL only if it does not end."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        raise AssertionError(f"{argv[:6]} ran past {timeout_s:.0f}s:\n{out[-4000:]}") from None
    assert proc.returncode == 0, out[-8000:]
    return out


def _ray_start(net: Net, role: str, args: list[str], tmp: str, env: dict) -> None:
    _run(["ip", "netns", "exec", net.ns[role], str(BIN / "ray"), "start",
          f"--node-ip-address={net.addr[role]}", "--num-gpus=0", f"--temp-dir={tmp}",
          "--object-store-memory=100000000", "--disable-usage-stats", *args], Path(tmp), env)


@pytest.fixture
def cluster(tmp_path):
    """Head + two workers, each in its namespace with its own Ray temp dir; afterwards every
    process in them stopped by PID and every namespace removed (also on failure)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs as root)")
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed")
    sweep_stale()
    net = Net(["head", "w0", "w1"])
    # Ray's socket paths must stay under 107 bytes: short temp dirs, not tmp_path
    tmps = {role: tempfile.mkdtemp(prefix=f"fplray-{role}-", dir="/tmp") for role in net.ns}
    env = {k: v for k, v in os.environ.items()
           if "proxy" not in k.lower() and k != "RAY_ADDRESS"}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_prestart_worker_first_driver="0",
               # this checkout's code, not the one the console script was installed from
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    try:
        try:
            net.create()
        except RuntimeError as exc:
            pytest.skip(f"cannot make network namespaces here: {exc}")
        head = f"{net.addr['head']}:{PORT}"
        _ray_start(net, "head", ["--head", f"--port={PORT}", "--num-cpus=0",
                                 "--include-dashboard=false"], tmps["head"], env)
        for role in ("w0", "w1"):
            _ray_start(net, role, [f"--address={head}", "--num-cpus=1"], tmps[role], env)
        yield net, head, tmps, env
    finally:
        # the hosts go down: every process of every namespace, by PID, all at once (one
        # grace period, not one per host), then each host checked empty
        hosts = [ns for ns in net.names() if ns in namespaces()]
        stop_tree(set().union(*(ns_pids(ns) for ns in hosts)), grace_s=5)
        for ns in hosts:
            empty_ns(ns)
        net.destroy()
        left = [n for n in namespaces() if n in net.names()] + root_links()
        procs = {p for tmp in tmps.values() for p in pids_naming(tmp)}
        for tmp in tmps.values():
            shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"left behind: {left}"
        assert not procs, f"Ray processes left: {procs}"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone meanwhile
        return b""


def _differing(a: list[dict], b: list[dict]) -> set[str]:
    """The columns whose text differs in any row (same rows and columns asserted)."""
    assert len(a) == len(b) and [list(r) for r in a] == [list(r) for r in b]
    return {k for ra, rb in zip(a, b) for k in ra if ra[k] != rb[k]}


def test_flower_pfl_run_on_a_three_host_ray_cluster_equals_one_machine(cluster, tmp_path):
    net, head, tmps, env = cluster
    # every node's Ray lives in its own temp dir (its raylet names it), not in /tmp/ray
    for role, ns in net.ns.items():
        cmdlines = [_cmdline(p) for p in ns_pids(ns)]
        assert any(b"raylet" in c and tmps[role].encode() in c for c in cmdlines), role

    one = tmp_path / "one-machine"
    one.mkdir()
    (one / "run.yaml").write_text(yaml.safe_dump({**RUN, "output-dir": str(one / "out")}))
    _run([str(BIN / "flower-pfl"), "run", "--config", "run.yaml", "--timeout", "600"], one, env)

    work = tmp_path / "cluster"
    work.mkdir()
    (work / "run.yaml").write_text(yaml.safe_dump({**RUN, "output-dir": str(work / "out")}))
    said = _run(["ip", "netns", "exec", net.ns["head"], str(BIN / "flower-pfl"), "run",
                 "--config", "run.yaml", "--ray-address", head, "--timeout", "600"], work, env)
    print(said)  # the console of the cluster run (shown with -s, and on failure)
    assert f"the clients run on the Ray cluster at {head} (--ray-address)" in said, said
    # Flower's simulation process, the one connected to Ray, saw the three nodes
    joined = re.search(r"\[flower-pfl\] Ray cluster at (\S+) \(RAY_ADDRESS=(\S+)\): (\d+) "
                       r"node\(s\) alive \(([^)]*)\), (\S+) CPUs, (\S+) GPUs", said)
    assert joined, said[-4000:]
    assert joined.groups() == (head, head, "3", ", ".join(sorted(net.addr.values())), "2", "0")
    for role in net.ns:  # the cluster run left nothing of its own on the nodes
        assert not [p for p in ns_pids(net.ns[role]) if b"flwr" in _cmdline(p)], role

    run_one, run_cluster = _only_run(one / "out"), _only_run(work / "out")
    fits = _rows(run_cluster / "fit.csv")
    assert len(fits) == RUN["rounds"] * RUN["clients"]
    ips = {r["ray_node_ip"] for r in fits}
    assert ips == {net.addr["w0"], net.addr["w1"]}, ips  # both workers, never the head
    for role in ("w0", "w1"):  # one node id per worker: the one its raylet logged
        (node_id,) = {r["ray_node"] for r in fits if r["ray_node_ip"] == net.addr[role]}
        logs = "".join(p.read_text(errors="replace")
                       for p in Path(tmps[role]).glob("session_latest/logs/raylet*.out"))
        assert re.fullmatch(r"[0-9a-f]{56}", node_id) and node_id in logs, role

    # the per-client metrics equal the single-machine run's, bit for bit (the CSV text);
    # what differs: the Ray node (there: this machine's private instance, one node) and
    # rounds.csv's wall-clock elapsed_s
    single = _rows(run_one / "fit.csv")
    assert len({r["ray_node"] for r in single}) == 1
    assert not {r["ray_node_ip"] for r in single} & set(net.addr.values())
    assert _differing(fits, single) == NODE_COLUMNS
    assert _differing(_rows(run_cluster / "clients.csv"), _rows(run_one / "clients.csv")) == set()
    assert _differing(_rows(run_cluster / "rounds.csv"), _rows(run_one / "rounds.csv")) <= \
        {"elapsed_s"}
