"""Real networked deployment: a SuperLink and N SuperNodes as separate processes.

    flower-pfl certs DIR [--host NAME ...]        throwaway CA + server certificate (testing)
    flower-pfl node-key DIR NAME                  an EC key pair for SuperNode authentication
    flower-pfl deploy --config FILE --certs DIR [--nodes N] [--gpus 0,1] [--insecure]

``deploy`` runs everything on THIS machine (all on 127.0.0.1): a secure SuperLink (TLS +
SuperNode authentication), one SuperNode per client (``partition-id``, ``num-partitions``,
``data-root``, ``state-dir`` in ``--node-config``; its ``CUDA_VISIBLE_DEVICES``, torch
threads and registered key); then ``flwr run`` with the same YAML as simulation; it checks
the run's final status and stops every process by PID.

On separate machines the same pieces are started one machine at a time by ``flower-pfl
superlink`` / ``supernode`` / ``submit`` (flower_pfl/running/sites.py), from the building
blocks below, so a deployment on one machine and one on many start Flower the same way.

The throwaway CA and node keys come from :mod:`flower_pfl.running.certs`.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from flower_pfl import config as config_mod
from flower_pfl.running.certs import make_node_key
from flower_pfl.running.procs import (
    APP_DIR,
    LaunchError,
    OnLine,
    ProcessSet,
    RunOutcome,
    bin_path,
    flwr_env,
    flwr_run,
    free_port,
    process_tree,
    run,
    stop_tree,
    toml_string,
    wait_http,
)


# ----------------------------------------------------------------------- certificates
# ------------------------------------------------------------------ building blocks
def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::1]:9092``) -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise LaunchError(f"{address!r} is not HOST:PORT (e.g. 10.0.0.1:9092)")
    return host.strip("[]"), int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def connect_host(host: str) -> str:
    """Where to reach a server bound to ``host`` from its own machine (Flower does the same
    for the SuperLink's own ServerApp: 0.0.0.0 -> 127.0.0.1)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def cert_paths(certs_dir: str | Path) -> dict[str, Path]:
    """ca.crt, server.pem, server.key of ``certs_dir`` (absolute); a missing one is an error."""
    root = Path(certs_dir).expanduser().resolve()
    certs = {"ca": root / "ca.crt", "cert": root / "server.pem", "key": root / "server.key"}
    missing = [str(p) for p in certs.values() if not p.is_file()]
    if missing:
        raise LaunchError(f"missing certificate files: {missing} (make test ones with "
                          f"`flower-pfl certs {certs_dir}`)")
    return certs


def write_connection(flwr_home: Path, name: str, address: str, ca: Path | None) -> Path:
    """``$FLWR_HOME/config.toml`` with one connection ``name`` (the default) to ``address``:
    what the ``flwr`` CLI (run, ls, supernode register) reads. Paths absolute (Flower
    refuses relative ones)."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    lines = [f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]',
             f"address = {toml_string(address)}"]
    if ca is not None:
        lines.append(f"root-certificates = {toml_string(str(Path(ca).resolve()))}")
    else:
        lines.append("insecure = true")
    path = flwr_home / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


#: the state of the SuperLink ``flower-pfl deploy`` starts: Flower's in-memory link state
#: and object store (Flower's default), not SQLite.  That SuperLink lives for one run on
#: this machine, so a file would outlive nothing that is read again; and every request
#: the run makes (each object of each message, each poll) costs the SuperLink several SQL
#: queries in a file (traced: most of its ~25 ms of CPU per request).  Measured with
#: benchmarks/deploy_overhead.py (docs/deployment.md): 4.07 / 3.94 s a round against
#: 5.98 / 5.51 with the file.  ``flower-pfl superlink`` (a SuperLink between hosts, which
#: may be restarted) keeps its database file.
DEPLOY_DATABASE = ":flwr-in-memory:"


def superlink_command(host: str, port: int, certs: dict[str, Path] | None,
                      database: Path | str) -> list[str]:
    """``flower-superlink`` with TLS and SuperNode authentication (``certs``), or insecure;
    ``database``: a file, or :data:`DEPLOY_DATABASE` (its state in memory)."""
    cmd = [bin_path("flower-superlink"), "--host", host, "--port", str(port),
           "--disable-runtime-dependency-installation", "--isolation", "subprocess",
           "--database", str(database)]
    if certs:
        cmd += ["--ssl-ca-certfile", str(certs["ca"]), "--ssl-certfile", str(certs["cert"]),
                "--ssl-keyfile", str(certs["key"]), "--enable-supernode-auth"]
    else:
        cmd.append("--insecure")
    return cmd


#: the SuperExec a SuperLink starts looks for new ServerApp tasks every 0.5 s: one ServerApp
#: per run, so it costs a run at most 0.5 s once; at the nodes' 0.1 s (procs.flwr_env) it
#: was 10 requests a second to the SuperLink for as long as the run lasted (traced:
#: a fifth of them, docs/deployment.md).  One set in the environment is kept.
SUPERLINK_TASK_POLL_S = "0.5"


def superlink_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a ``flower-superlink`` process: its SuperExec's task poll
    :data:`SUPERLINK_TASK_POLL_S` unless ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` is set in
    this process' environment."""
    out = dict(env)
    if "FLWR_SUPEREXEC_TASK_POLL_INTERVAL" not in os.environ:
        out["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = SUPERLINK_TASK_POLL_S
    return out


def wait_superlink(proc: subprocess.Popen[bytes] | subprocess.Popen[str], host: str, port: int,
                   ca: Path | None, timeout_s: float = 120) -> None:
    scheme = "https" if ca else "http"
    wait_http(f"{scheme}://{join_address(connect_host(host), port)}/health", timeout_s, proc,
              cafile=str(ca) if ca else None)


def register_key(public_key: Path, name: str, connection: str, env: Mapping[str, str]) -> str:
    """Register a SuperNode's public key on the SuperLink of ``connection``; returns
    ``"registered"`` or ``"already registered"`` (a SuperLink restarted on its database)."""
    out = run([bin_path("flwr"), "supernode", "register", str(public_key), connection,
               "--name", name], env=env, capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    if out.returncode == 0:
        return "registered"
    if "already in use" in text:
        return "already registered"
    raise LaunchError(f"registering {name} ({public_key}) failed: {text[-1200:]}")


# Flower 1.42's Fleet API error codes (flwr.supercore.error.ApiErrorCode) the probe reads
INVALID_HEARTBEAT_INTERVAL, NODE_ACTIVATION_FAILED = 2003, 2004


def key_registered(superlink: str, ca: Path | None, private_key: Path) -> bool | None:
    """Ask the SuperLink whether the public key of ``private_key`` is registered, changing
    nothing (a SuperNode refused activation is either unregistered or still counted online
    after a crash). The probe is the SuperNode's signed ``ActivateNode`` request with a
    heartbeat interval of 0: Flower 1.42's ``fleet_handlers.activate_node`` looks the key
    up FIRST (unknown: error 2004) and checks the interval only for a known key (error
    2003), before activating anything. True: registered; False: not; None: no such answer
    (unreachable within Flower's 30 s, another Flower version)."""
    try:
        import httpx
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.serialization import load_ssh_private_key
        from flwr.proto.fleet_pb2 import ActivateNodeRequest  # pylint: disable=E0611
        from flwr.supercore.error import FlowerError
        from flwr.supercore.interceptors.http.runtime_version import (
            RuntimeVersionHttpInterceptor,
        )
        from flwr.supercore.primitives.asymmetric import public_key_to_bytes
        from flwr.supernode.fleet_http_client import FleetHttpClient
        from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor
    except ImportError:
        return None
    try:
        key = load_ssh_private_key(Path(private_key).expanduser().read_bytes(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            return None  # Flower's node auth signs with ECDSA: another key cannot probe
        with FleetHttpClient.from_server_address(
                superlink, ca is None, None if ca is None else str(ca),
                interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperNode"),
                              NodeAuthHttpInterceptor(key, key.public_key())]) as client:
            client.ActivateNode(ActivateNodeRequest(
                public_key=public_key_to_bytes(key.public_key()), heartbeat_interval=0))
    except httpx.HTTPStatusError as exc:
        error = FlowerError.from_json(exc.response.text)
        code = error.code if error is not None else None
        answers: dict[int | None, bool] = {INVALID_HEARTBEAT_INTERVAL: True,
                                           NODE_ACTIVATION_FAILED: False}
        return answers.get(code)
    except Exception:  # noqa: BLE001 - unreachable, bad key file, ...: cannot tell
        return None
    return None  # accepted an out-of-bounds interval: not the Flower this was written for


def node_data_root(data_root: str | None, pid: int) -> str | None:
    """The ``data-root`` of node ``pid``: ``<data_root>/<pid>`` when that is a shard folder
    (``flower-pfl partition --out <data_root>``), else ``data_root`` itself (a dataset)."""
    from flower_pfl.learning.shards import is_shard_folder

    if data_root and is_shard_folder(Path(data_root) / str(pid)):
        return str(Path(data_root) / str(pid))
    return data_root


def node_config(pid: int, num_partitions: int, state_dir: str | Path,
                data_root: str | Path | None = None) -> str:
    """The SuperNode's ``--node-config``: its identity, its disk, its data."""
    items = {"state-dir": str(state_dir)}
    if data_root:
        items["data-root"] = str(data_root)
    for key, value in items.items():
        if '"' in value or "\\" in value:
            raise LaunchError(f"{key} {value!r}: a path with a quote or backslash cannot go "
                              f"into Flower's --node-config")
    return " ".join([f"partition-id={pid}", f"num-partitions={num_partitions}",
                     *(f'{k}="{v}"' for k, v in items.items())])


def supernode_command(superlink: str, port: int, config: str, ca: Path | None,
                      key: Path | None, max_retries: int | None = None,
                      engine: str = "tuned") -> list[str]:
    """``flower-supernode`` for ``superlink`` (TLS with root ``ca`` and node-auth ``key``,
    or insecure without ``ca``); ``port``: its local ClientApp API port; ``engine``: tuned
    through :mod:`flower_pfl.tuned.entry` (docs/engine.md), stock Flower's binary."""
    from flower_pfl.tuned import programs

    cmd = [*programs.command(engine, bin_path("flower-supernode")),
           "--superlink", superlink, "--host", "127.0.0.1", "--port", str(port),
           "--node-config", config]
    if max_retries is not None:
        cmd += ["--max-retries", str(max_retries)]
    if ca is not None:
        cmd += ["--root-certificates", str(ca)]
        if key is not None:
            cmd += ["--auth-supernode-private-key", str(key)]
    else:
        cmd.append("--insecure")
    return cmd


def submit_run(env: Mapping[str, str], connection: str, config_path: Path, overrides: Sequence[str],
               results_dir: Path, workdir: Path, procs: ProcessSet, app_dir: Path = APP_DIR,
               timeout_s: float | None = None, echo: bool = False,
               on_line: OnLine | None = None, stall_s: float | None = None,
               see: Sequence[Path] = ()) -> RunOutcome:
    """``flwr run`` the app with this YAML on the SuperLink of ``connection``, streamed to
    ``<results_dir>/flwr-run.log``; a LaunchError unless it finished ``completed``."""
    results_dir = Path(results_dir).resolve()
    results_dir.mkdir(parents=True, exist_ok=True)
    cfg = config_mod.load(Path(config_path), list(overrides) or None)
    run_config: dict[str, str | bool] = {
        "cfg": cfg.to_json(),  # validated once; the ServerApp and clients read it
        "config-file": str(Path(config_path).resolve()),
        "overrides": " ".join(overrides), "results-dir": str(results_dir)}
    return flwr_run(run_config, workdir, env, procs, results_dir / "flwr-run.log",
                    federation=connection, app_dir=app_dir, echo=echo, timeout_s=timeout_s,
                    on_line=on_line, stall_s=stall_s, see=see)


# ------------------------------------------------------------------------- processes
@dataclass
class Node:
    pid: int  # partition-id
    name: str
    port: int
    key: Path | None
    gpu: str | None
    process: subprocess.Popen[bytes] | None = None


@dataclass
class Deployment:
    """A SuperLink and its SuperNodes on this machine; ``close()`` stops them all."""

    workdir: Path
    num_partitions: int
    certs: dict[str, Path] | None  # None: insecure (only when asked for)
    data_root: str | None = None  # a dataset folder, or the folder `flower-pfl partition` wrote
    engine: str = "tuned"  # the YAML's `engine`: how its SuperNodes start (supernode_command)
    threads: int | None = 1  # torch threads of each node's ClientApps (OMP_NUM_THREADS)
    procs: ProcessSet = field(default_factory=ProcessSet)
    nodes: dict[str, Node] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Flower's config.toml and the SuperNodes (started elsewhere in the tree) need
        # absolute paths: `--certs certs/` must work as typed
        self.workdir = Path(self.workdir).resolve()
        if self.certs:
            self.certs = {k: Path(v).resolve() for k, v in self.certs.items()}
        if self.data_root:
            self.data_root = str(Path(self.data_root).expanduser().resolve())
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.env = flwr_env(self.workdir / "flwr-home", self.port)
        write_connection(self.workdir / "flwr-home", "deploy", f"127.0.0.1:{self.port}",
                         self.certs["ca"] if self.certs else None)

    # -- SuperLink
    def start_superlink(self) -> None:
        """The SuperLink, with its state in memory (:data:`DEPLOY_DATABASE`)."""
        cmd = superlink_command("127.0.0.1", self.port, self.certs, DEPLOY_DATABASE)
        proc = self.procs.start(cmd, superlink_env(self.env), self.workdir / "superlink.log")
        wait_superlink(proc, "127.0.0.1", self.port, self.certs["ca"] if self.certs else None)

    def register(self, public_key: Path, name: str) -> None:
        register_key(public_key, name, "deploy", self.env)

    # -- SuperNodes
    def add_node(self, pid: int, name: str | None = None, key: Path | None = None,
                 gpu: str | None = None) -> Node:
        name = name or f"client-{pid}"
        node = Node(pid, name, free_port(), key, gpu)
        self.nodes[name] = node
        return node

    def node_command(self, node: Node) -> tuple[list[str], dict[str, str]]:
        """The node's ``flower-supernode`` command and environment. Its disk is
        ``<workdir>/client-state/<name>``; its data ``<data-root>/<pid>`` when that is a
        shard, else ``data-root``; ``OMP_NUM_THREADS`` = ``threads`` (``client-resources.
        num-cpus``, as Ray gives a simulated client; one set already is kept): nodes sharing
        cores with torch's default threads spin against each other (docs/deployment.md)."""
        config = node_config(node.pid, self.num_partitions,
                             self.workdir / "client-state" / node.name,
                             node_data_root(self.data_root, node.pid))
        cmd = supernode_command(f"127.0.0.1:{self.port}", node.port, config,
                                self.certs["ca"] if self.certs else None, node.key,
                                max_retries=20, engine=self.engine)
        env = dict(self.env)
        if self.threads is not None:
            env.setdefault("OMP_NUM_THREADS", str(self.threads))
        if node.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = node.gpu  # its ClientApp processes inherit it
        return cmd, env

    def start_node(self, node: Node) -> subprocess.Popen[bytes]:
        cmd, env = self.node_command(node)
        node.process = self.procs.start(cmd, env, self.workdir / f"{node.name}.log")
        return node.process

    def stop_node(self, node: Node) -> None:
        if node.process is not None:
            stop_tree(process_tree(node.process.pid))
            node.process.wait(timeout=10)

    # -- runs
    def run(self, config_path: Path, overrides: Sequence[str], results_dir: Path,
            app_dir: Path = APP_DIR, timeout_s: float | None = None, echo: bool = False,
            on_line: OnLine | None = None, stall_s: float | None = None) -> RunOutcome:
        return submit_run(self.env, "deploy", config_path, overrides, results_dir,
                          self.workdir, self.procs, app_dir, timeout_s, echo, on_line, stall_s,
                          see=(self.workdir,))

    def close(self) -> None:
        # SuperNodes first, then the SuperLink (flower-notes.md)
        for node in self.nodes.values():
            try:
                self.stop_node(node)
            except Exception:  # noqa: BLE001 - keep stopping the rest
                pass
        self.procs.stop()

    def __enter__(self) -> "Deployment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_gpus(gpus: Sequence[str], flag: str = "--gpus") -> None:
    """``gpus`` (the option ``flag``: ``deploy --gpus``, ``supernode --gpu``) names CUDA
    devices of this machine; a CPU-only machine is an error, not a silent CPU run."""
    if not gpus:
        return
    import torch

    given = f"{flag} {','.join(gpus)}"
    if not torch.cuda.is_available():
        raise LaunchError(f"{given}: this machine has no CUDA device "
                          f"(torch {torch.__version__}); leave {flag} out to run on the CPU")
    count = torch.cuda.device_count()
    bad = [g for g in gpus if not g.isdigit() or int(g) >= count]
    if bad:
        raise LaunchError(f"{given}: no such device {bad}; this machine has "
                          f"{count} (ids 0..{count - 1})")


def deploy(config_path: Path, overrides: Sequence[str], results_dir: Path, num_nodes: int,
           certs_dir: Path | None, gpus: Sequence[str] = (), data_root: str | None = None,
           timeout_s: float | None = None, echo: bool = True) -> RunOutcome:
    """Start a SuperLink + ``num_nodes`` SuperNodes here, run, check, stop everything."""
    workdir = results_dir / "deployment"  # logs, keys, the nodes' state dirs: kept
    check_gpus(gpus)
    certs = cert_paths(certs_dir) if certs_dir is not None else None
    cfg = config_mod.load(config_path, list(overrides) or None)  # stall-timeout, engine
    with Deployment(workdir, num_nodes, certs, data_root, engine=cfg["engine"],
                    threads=cfg["client-resources.num-cpus"]) as dep:
        dep.start_superlink()
        for pid in range(num_nodes):
            key = None
            if certs is not None:
                key, pub = make_node_key(workdir / "keys", f"client-{pid}")
                dep.register(pub, f"client-{pid}")
            node = dep.add_node(pid, key=key, gpu=gpus[pid % len(gpus)] if gpus else None)
            dep.start_node(node)
        time.sleep(1)
        return dep.run(config_path, overrides, results_dir, timeout_s=timeout_s, echo=echo,
                       stall_s=cfg["stall-timeout"])
