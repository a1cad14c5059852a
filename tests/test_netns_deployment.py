"""Separate hosts: the SuperLink and each SuperNode in its own Linux network namespace.

One namespace per host (``fpl-link-<tag>``, ``fpl-n0-<tag>`` ...), each with a veth pair to
a bridge in a hub namespace (``fpl-hub-<tag>``) and an address in a private /24 that
exists only inside these namespaces. The SuperLink listens on its private address with
a certificate made for that address (``flower-pfl certs --host``); the SuperNodes reach
it over that address with TLS and node authentication. Every host is started with the
command a user types (``ip netns exec <host> flower-pfl superlink|supernode|submit``,
relative paths from the host's folder). Each client host gets only its own shard
(``flower-pfl partition``): the pooled dataset, its caches and the other shards are
hidden from it (an empty tmpfs mounted over them in the host's mount namespace, which
``ip netns exec`` makes private), so a node that fell back to the pooled data would fail.

The kill test SIGKILLs every process of one client host after round 1 and starts the same
command again: the SuperLink refuses to activate the node until it has missed two of the
old one's heartbeats (Flower: 30 s each), ``flower-pfl supernode`` retries, and the node
rejoins under its node id with its state from its ``--state-dir``.

``<tag>`` is random plus the owning pytest's PID: a failed run's leftovers are swept at
the next start (only those whose owner is gone). Everything is removed in ``finally``
blocks and fixture finalizers, and the finalizer asserts nothing of it is left. Needs
root and ``ip netns`` (CI runs as root); skipped with the reason otherwise.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flower_pfl.learning import data
from tests.netns import HIDE, Net, crash, empty_ns, namespaces, root_links, sweep_stale

pytestmark = pytest.mark.slow

FPL = str(Path(sys.executable).parent / "flower-pfl")
PORT = 9092
RUN = {"strategy": "fedamp", "rounds": 3, "clients": 3, "fraction-fit": 1.0, "model": "mclr",
       "round-timeout": 60, "seed": 0,
       "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 3000}}


@pytest.fixture(scope="module")
def net():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs as root)")
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed")
    sweep_stale()
    net = Net(["link", "n0", "n1", "n2"])
    try:
        net.create()
    except RuntimeError as exc:
        net.destroy()
        pytest.skip(f"cannot make network namespaces here: {exc}")
    try:
        yield net
    finally:
        net.destroy()
        left = [n for n in namespaces() if n in net.names()] + root_links()
        assert not left, f"left behind: {left}"


@pytest.fixture
def hosts(net, tmp_path):
    """Per test: a folder per host; afterwards every process in every host is stopped."""
    yield tmp_path
    for ns in net.names():
        empty_ns(ns)


def _fpl(*args: str, cwd: Path) -> str:
    out = subprocess.run([FPL, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _wait_for(log: Path, text: str, proc: subprocess.Popen, timeout_s: float = 180) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        content = log.read_text(errors="replace") if log.exists() else ""
        if text in content:
            return content
        assert proc.poll() is None, f"exited with {proc.returncode} before {text!r}:\n{content}"
        time.sleep(0.5)
    raise AssertionError(f"no {text!r} in {log} within {timeout_s:.0f}s")


def _setup(net: Net, root: Path, run: dict, shard_sets: dict[str, str | None]):
    """The server's folder (certs for its private address, the run's YAML, the nodes'
    public keys) and one folder per client host (ca.crt, its key, its shard only).
    ``shard_sets[node]``: extra ``--set`` for that node's shard (None: the run's)."""
    server = root / "server"
    server.mkdir()
    (server / "run.yaml").write_text(yaml.safe_dump(run))
    _fpl("certs", "certs", "--host", net.addr["link"], cwd=server)
    made: dict[str | None, Path] = {}
    for extra in dict.fromkeys(shard_sets.values()):  # in host order: shards-0 is n0's
        out = f"shards-{len(made)}"
        _fpl("partition", "--config", "run.yaml", "--out", out,
             *(["--set", extra] if extra else []), cwd=server)
        made[extra] = server / out
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    hidden = [str(p) for p in (data.DEBIAN_FMNIST_DIR, data.default_cache_dir(),
                               Path.home() / ".cache" / "flower-pfl", *made.values())
              if p.is_dir()]
    nodes = {}
    for i, (role, extra) in enumerate(shard_sets.items()):
        host = root / role
        host.mkdir()
        shutil.copytree(made[extra] / str(i), host / "data")  # its shard, nothing else
        shutil.copy(server / "certs" / "ca.crt", host / "ca.crt")
        _fpl("node-key", "keys", f"client-{i}", cwd=host)
        (server / "pubkeys").mkdir(exist_ok=True)
        shutil.copy(host / "keys" / f"client-{i}.pub", server / "pubkeys")
        argv = [FPL, "supernode", "--superlink", f"{net.addr['link']}:{PORT}", "--ca", "ca.crt",
                "--key", f"keys/client-{i}.key", "--partition-id", str(i), "--data", "data",
                "--state-dir", "state"]
        node_env = {**env, "FLWR_HOME": str(host / "flwr-home"),
                    "FLOWER_PFL_CACHE": str(host / "cache")}
        nodes[role] = (host, argv, node_env, hidden)
    return server, env, nodes


def _start_superlink(net: Net, server: Path, env: dict) -> subprocess.Popen:
    log = server / "superlink.out"
    proc = net.start("link", [FPL, "superlink", "--certs", "certs", "--keys-dir", "pubkeys",
                              "--address", f"{net.addr['link']}:{PORT}"], server, log, env)
    _wait_for(log, "SuperLink ready", proc)
    return proc


def _start_node(net: Net, role: str, node, attempt: int = 0) -> tuple[subprocess.Popen, Path]:
    host, argv, env, hidden = node
    log = host / f"supernode-{attempt}.out"
    return net.start(role, argv, host, log, env, hidden), log


def _node_id(log_text: str) -> str:
    return re.search(r"connected to the SuperLink at \S+ as node (\S+)", log_text).group(1)


def _submit(net: Net, server: Path, env: dict, on_line=None) -> tuple[int, str]:
    argv = ["ip", "netns", "exec", net.ns["link"], FPL, "submit", "--superlink",
            f"{net.addr['link']}:{PORT}", "--ca", "certs/ca.crt", "--config", "run.yaml",
            "--results", "res", "--timeout", "900"]
    proc = subprocess.Popen(argv, cwd=server, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line)
        return proc.wait(timeout=60), "".join(lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _rows(path: Path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def _assert_no_colour_codes(root: Path, *outputs: str) -> None:
    """Every log file and every piped output of every host: no ANSI codes (Flower's logger
    colours its level names into pipes and files alike)."""
    files = [p for p in root.rglob("*") if p.suffix in (".log", ".out") and p.is_file()]
    assert any(p.suffix == ".log" for p in files) and any(p.suffix == ".out" for p in files)
    dirty = [str(p) for p in files if "\x1b[" in p.read_text(errors="replace")]
    assert not dirty, dirty
    assert not any("\x1b[" in text for text in outputs)


def _failed_here(text: str) -> list[str]:
    """A SuperNode's console lines about messages that failed on it."""
    return [line for line in text.splitlines() if "failed on this node" in line]


def test_hosts_in_namespaces_run_fedamp_and_a_killed_host_rejoins_with_its_state(net, hosts):
    # 5 rounds: a crashed SuperNode can rejoin only once the SuperLink has missed two of its
    # heartbeats (up to ~60 s, Flower's fixed interval); the run goes on meanwhile
    run = {**RUN, "rounds": 5}
    server, env, nodes = _setup(net, hosts, run, {"n0": None, "n1": None, "n2": None})
    from cryptography import x509
    from cryptography.x509.oid import ExtensionOID

    cert = x509.load_pem_x509_certificate((server / "certs" / "server.pem").read_bytes())
    sans = cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME)
    assert net.addr["link"] in [str(ip) for ip in sans.value.get_values_for_type(x509.IPAddress)]
    # a client host cannot read the pooled dataset: loading it there fails
    host, _, node_env, hidden = nodes["n0"]
    probe = subprocess.run(["ip", "netns", "exec", net.ns["n0"], "sh", "-c", HIDE, "sh",
                            sys.executable, "-c", "from flower_pfl.learning import data; "
                            "data.load_pooled('fmnist', None, None)"],
                           env={**node_env, "FPL_HIDE": " ".join(hidden)},
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode != 0 and "could not load dataset" in probe.stderr, probe.stderr[-800:]

    _start_superlink(net, server, env)
    started = {role: _start_node(net, role, node) for role, node in nodes.items()}
    first_id = {role: _node_id(_wait_for(log, "connected to the SuperLink", proc))
                for role, (proc, log) in started.items()}
    events = []

    def kill_n1_in_round_2(line: str) -> None:
        if "[ROUND 2]" in line and not events:
            # client host 1 goes down once it has taken round 2's train message (a message
            # the SuperLink hands out once): all its processes, SIGKILL, mid-round
            proc, log = started["n1"]
            deadline = time.time() + 120
            while log.read_text(errors="replace").count("Receiving: train message") < 2:
                assert time.time() < deadline and proc.poll() is None, "no round-2 message"
                time.sleep(0.1)
            events.append("killed")
            crash(net.ns["n1"])
            assert started["n1"][0].poll() is not None
            started["n1"] = _start_node(net, "n1", nodes["n1"], attempt=1)  # same command
            events.append("restarted")

    code, output = _submit(net, server, env, kill_n1_in_round_2)
    assert code == 0 and "completed" in output, output[-3000:]
    assert events == ["killed", "restarted"]
    # it rejoined under the same node id (node authentication) and partition-id 1, after
    # one line saying why the SuperLink refused it at first (its key IS registered)
    proc, log = started["n1"]
    rejoin = _wait_for(log, "connected to the SuperLink", proc)
    assert _node_id(rejoin) == first_id["n1"]
    assert rejoin.count("although its key is registered: it still counts this node as "
                        "online") == 1, rejoin
    assert "not registered" not in rejoin, rejoin
    assert rejoin.count("Exit Code: 305") == 1  # Flower's refusal, shown for the 1st try only
    # the killed node's round-2 message: reported as the node gone, with the fix, on the
    # server's console and in failures.csv (not as an exception of the client)
    gone = [f for f in _rows(server / "res" / "failures.csv")
            if (f["round"], f["phase"], f["partition-id"]) == ("2", "fit", "1")]
    assert len(gone) == 1 and gone[0]["reason"].startswith("node gone"), gone
    assert "start its `flower-pfl supernode` again with the same command" in gone[0]["reason"]
    assert f"fit of partition-id 1 failed: {gone[0]['reason']}" in output

    res = server / "res"
    final = {int(r["partition-id"]): r for r in _rows(res / "clients.csv")
             if int(r["round"]) == run["rounds"]}
    assert sorted(final) == [0, 1, 2]
    fits = [int(r["round"]) for r in _rows(res / "fit.csv") if int(r["partition-id"]) == 1]
    assert 1 in fits and max(fits) > 1  # trained before the kill and after it came back
    # its fit counter lives in context.state, mirrored to its state-dir: after the restart
    # it continued from disk (a fresh state would count only the fits after the restart)
    assert int(final[1]["fit-rounds"]) == len(fits), (final[1], fits)
    state = nodes["n1"][0] / "state"
    assert [p.name for p in state.glob("run-*/partition-*")] == ["partition-1"]
    assert not (nodes["n1"][0] / "cache").exists() or \
        not any((nodes["n1"][0] / "cache").rglob("*.npy"))  # never built a pooled cache
    for ns in net.names():  # stopping the hosts' commands stops everything they started
        empty_ns(ns)
    _assert_no_colour_codes(hosts, output)


def test_a_node_given_a_shard_of_other_settings_fails_with_the_reason(net, hosts):
    """Also: a SuperNode whose key was never registered is told so and stops."""
    run = {**RUN, "clients": 2, "rounds": 1}
    server, env, nodes = _setup(net, hosts, run, {"n0": None, "n1": "seed=1"})
    rogue = hosts / "n2"  # a third machine whose public key never reached the server
    rogue.mkdir()
    shutil.copy(server / "certs" / "ca.crt", rogue / "ca.crt")
    _fpl("node-key", "keys", "rogue", cwd=rogue)
    _start_superlink(net, server, env)
    rogue_proc = net.start("n2", [FPL, "supernode", "--superlink", f"{net.addr['link']}:{PORT}",
                                  "--ca", "ca.crt", "--key", "keys/rogue.key", "--partition-id",
                                  "1", "--num-partitions", "2", "--state-dir", "state"],
                           rogue, rogue / "supernode-0.out",
                           {**env, "FLWR_HOME": str(rogue / "flwr-home")})
    for role, node in nodes.items():
        proc, log = _start_node(net, role, node)
        _wait_for(log, "connected to the SuperLink", proc)
    assert rogue_proc.wait(timeout=120) == 1
    said = (rogue / "supernode-0.out").read_text(errors="replace")
    assert said.count("its key /") == 1 and "keys/rogue.key is not registered there" in said
    assert "put " + str(rogue / "keys" / "rogue.pub") + " in the --keys-dir" in said
    assert "counts this node as online" not in said, said
    assert "connected to the SuperLink" not in said, said
    assert (server / "superlink.out").read_text(errors="replace").count(
        "a SuperNode whose key is not registered here was refused") == 1  # once per key

    code, output = _submit(net, server, env)
    assert code == 0, output[-3000:]  # the other client's round went on
    # the server's failures.csv and console: the client's whole reason, its fix included
    failures = _rows(server / "res" / "failures.csv")
    assert {(f["phase"], int(f["partition-id"])) for f in failures} == {("fit", 1),
                                                                         ("evaluate", 1)}
    for f in failures:
        reason = f["reason"]
        assert reason.startswith("client raised: ShardError: data-root ") and \
            "is refused" in reason and "seed: 1 vs 0" in reason, reason
        assert reason.endswith("(it was made by `flower-pfl partition --config run.yaml --set "
                               "seed=1 --out shards-1`), and give this machine <DIR>/1"), reason
        assert f"{f['phase']} of partition-id 1 failed: {reason}" in output
    # the client machine: one line per failed message on its console, the traceback in its log
    console = (nodes["n1"][0] / "supernode-0.out").read_text(errors="replace")
    lines = _failed_here(console)
    assert len(lines) == 2 and lines[0].startswith(
        "flower-pfl: the train message of round 1 failed on this node: ShardError: "), lines
    assert failures[0]["reason"][len("client raised: "):] in lines[0]
    assert lines[1].endswith("with the same error (2 messages so far)"), lines
    assert "Traceback" not in console and "Exit Code: 800" not in console
    log = (nodes["n1"][0] / "state" / "supernode.log").read_text(errors="replace")
    assert log.count("Traceback (most recent call last)") == 2
    for ns in net.names():
        empty_ns(ns)
    _assert_no_colour_codes(hosts, output)
