"""Real networked deployment: a SuperLink and N SuperNodes as separate processes.

    flower-pfl certs DIR [--host NAME ...]        throwaway CA + server certificate (testing)
    flower-pfl node-key DIR NAME                  an EC key pair for SuperNode authentication
    flower-pfl deploy --config FILE --certs DIR [--nodes N] [--gpus 0,1] [--insecure]

``deploy`` runs everything on THIS machine (all on 127.0.0.1): a secure SuperLink (TLS +
SuperNode authentication), one SuperNode per client with ``partition-id``,
``num-partitions``, ``data-root`` and ``state-dir`` in ``--node-config``, its own
``CUDA_VISIBLE_DEVICES`` and its registered key; then ``flwr run`` with the same YAML as
simulation; it checks the run's final status and stops every process by PID.  The
README's deployment section explains the same steps on separate machines.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from flower_pfl.procs import (
    APP_DIR,
    LaunchError,
    ProcessSet,
    RunOutcome,
    _bin,
    _stream,
    flwr_env,
    free_port,
    process_tree,
    run_status,
    stop_tree,
    toml_string,
    wait_http,
)


# ----------------------------------------------------------------------- certificates
def make_ca(directory: str | Path, hosts: Sequence[str] = ("127.0.0.1", "localhost", "::1"),
            days: int = 30) -> dict[str, Path]:
    """A throwaway CA and a server certificate for ``hosts`` (for testing only)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flower-pfl test CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP384R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": out / "ca.crt", "cert": out / "server.pem", "key": out / "server.key"}
    paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    os.chmod(paths["key"], 0o600)
    return paths


def make_node_key(directory: str | Path, name: str) -> tuple[Path, Path]:
    """An EC (P-384) key pair in OpenSSH format: (private key, public key) paths."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = out / f"{name}.key", out / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    os.chmod(private, 0o600)
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    return private, public


# ------------------------------------------------------------------------- processes
@dataclass
class Node:
    pid: int  # partition-id
    name: str
    port: int
    key: Path | None
    gpu: str | None
    process: subprocess.Popen | None = None


@dataclass
class Deployment:
    """A SuperLink and its SuperNodes on this machine; ``close()`` stops them all."""

    workdir: Path
    num_partitions: int
    certs: dict[str, Path] | None  # None: insecure (only when asked for)
    data_root: str | None = None
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
        (self.workdir / "flwr-home").mkdir(parents=True, exist_ok=True)
        conn = ['[superlink]\ndefault = "deploy"\n\n[superlink.deploy]',
                f'address = "127.0.0.1:{self.port}"']
        if self.certs:
            conn.append(f"root-certificates = {toml_string(str(self.certs['ca']))}")
        else:
            conn.append("insecure = true")
        (self.workdir / "flwr-home" / "config.toml").write_text("\n".join(conn) + "\n")

    # -- SuperLink
    def start_superlink(self) -> None:
        cmd = [_bin("flower-superlink"), "--host", "127.0.0.1", "--port", str(self.port),
               "--disable-runtime-dependency-installation", "--isolation", "subprocess",
               "--database", str(self.workdir / "superlink.db")]
        if self.certs:
            cmd += ["--ssl-ca-certfile", str(self.certs["ca"]), "--ssl-certfile",
                    str(self.certs["cert"]), "--ssl-keyfile", str(self.certs["key"]),
                    "--enable-supernode-auth"]
        else:
            cmd.append("--insecure")
        proc = self.procs.start(cmd, self.env, self.workdir / "superlink.log")
        scheme = "https" if self.certs else "http"
        wait_http(f"{scheme}://127.0.0.1:{self.port}/health", 120, proc,
                  cafile=str(self.certs["ca"]) if self.certs else None)

    def register(self, public_key: Path, name: str) -> None:
        out = subprocess.run([_bin("flwr"), "supernode", "register", str(public_key), "deploy",
                              "--name", name], env=self.env, capture_output=True, text=True,
                             timeout=120)
        if out.returncode != 0:
            raise LaunchError(f"registering {name} failed: {out.stdout[-800:]}{out.stderr[-800:]}")

    # -- SuperNodes
    def add_node(self, pid: int, name: str | None = None, key: Path | None = None,
                 gpu: str | None = None) -> Node:
        name = name or f"client-{pid}"
        node = Node(pid, name, free_port(), key, gpu)
        self.nodes[name] = node
        return node

    def start_node(self, node: Node) -> subprocess.Popen:
        state_dir = self.workdir / "client-state" / node.name  # the client machine's disk
        node_config = (f"partition-id={node.pid} num-partitions={self.num_partitions} "
                       f"state-dir=\"{state_dir}\"")
        if self.data_root:
            node_config += f" data-root=\"{self.data_root}\""
        cmd = [_bin("flower-supernode"), "--superlink", f"127.0.0.1:{self.port}",
               "--host", "127.0.0.1", "--port", str(node.port), "--node-config", node_config,
               "--max-retries", "20"]
        if self.certs:
            cmd += ["--root-certificates", str(self.certs["ca"])]
            if node.key is not None:
                cmd += ["--auth-supernode-private-key", str(node.key)]
        else:
            cmd.append("--insecure")
        env = dict(self.env)
        if node.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = node.gpu  # its ClientApp processes inherit it
        node.process = self.procs.start(cmd, env, self.workdir / f"{node.name}.log")
        return node.process

    def stop_node(self, node: Node) -> None:
        if node.process is not None:
            stop_tree(process_tree(node.process.pid))
            node.process.wait(timeout=10)

    # -- runs
    def run(self, config_path: Path, overrides: Sequence[str], results_dir: Path,
            app_dir: Path = APP_DIR, timeout_s: float | None = None, echo: bool = False,
            on_line=None, stall_s: float | None = None) -> RunOutcome:
        results_dir.mkdir(parents=True, exist_ok=True)
        run_config = self.workdir / "run-config.toml"
        run_config.write_text(
            f"config-file = {toml_string(str(Path(config_path).resolve()))}\n"
            f"overrides = {toml_string(' '.join(overrides))}\n"
            f"results-dir = {toml_string(str(results_dir.resolve()))}\n")
        cmd = [_bin("flwr"), "run", str(app_dir), "deploy", "--stream",
               "--run-config", str(run_config)]
        run_id = _stream(cmd, self.env, results_dir / "flwr-run.log", echo, timeout_s,
                         self.procs, on_line=on_line, stall_s=stall_s)
        status = run_status(run_id, self.env) if run_id else "unknown"
        if status != "finished:completed":
            raise LaunchError(f"run {run_id or '?'} ended with status '{status}'; see "
                              f"{results_dir / 'flwr-run.log'} and {self.workdir}")
        return RunOutcome(status, run_id, set(self.procs.known))

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

    def __exit__(self, *exc) -> None:
        self.close()


def check_gpus(gpus: Sequence[str]) -> None:
    """``--gpus`` names CUDA devices of this machine; a CPU-only machine is an error, not a
    silent CPU run."""
    if not gpus:
        return
    import torch

    if not torch.cuda.is_available():
        raise LaunchError(f"--gpus {','.join(gpus)}: this machine has no CUDA device "
                          f"(torch {torch.__version__}); leave --gpus out to run on the CPU")
    count = torch.cuda.device_count()
    bad = [g for g in gpus if not g.isdigit() or int(g) >= count]
    if bad:
        raise LaunchError(f"--gpus {','.join(gpus)}: no such device {bad}; this machine has "
                          f"{count} (ids 0..{count - 1})")


def deploy(config_path: Path, overrides: Sequence[str], results_dir: Path, num_nodes: int,
           certs_dir: Path | None, gpus: Sequence[str] = (), data_root: str | None = None,
           timeout_s: float | None = None, echo: bool = True) -> RunOutcome:
    """Start a SuperLink + ``num_nodes`` SuperNodes here, run, check, stop everything."""
    workdir = results_dir / "deployment"  # logs, keys, the nodes' state dirs: kept
    check_gpus(gpus)
    certs = None
    if certs_dir is not None:
        certs = {"ca": certs_dir / "ca.crt", "cert": certs_dir / "server.pem",
                 "key": certs_dir / "server.key"}
        missing = [str(p) for p in certs.values() if not p.is_file()]
        if missing:
            raise LaunchError(f"missing certificate files: {missing} (make test ones with "
                              f"`flower-pfl certs {certs_dir}`)")
    with Deployment(workdir, num_nodes, certs, data_root) as dep:
        dep.start_superlink()
        for pid in range(num_nodes):
            key = None
            if certs is not None:
                key, pub = make_node_key(workdir / "keys", f"client-{pid}")
                dep.register(pub, f"client-{pid}")
            node = dep.add_node(pid, key=key, gpu=gpus[pid % len(gpus)] if gpus else None)
            dep.start_node(node)
        time.sleep(1)
        from flower_pfl.config import load  # the watchdog's stall-timeout

        stall = load(config_path, list(overrides) or None)["stall-timeout"]
        return dep.run(config_path, overrides, results_dir, timeout_s=timeout_s, echo=echo,
                       stall_s=stall)
