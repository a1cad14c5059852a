"""One command per machine of a deployment on separate machines.

    flower-pfl superlink --certs DIR (--keys-dir DIR | --public-keys F.pub ...)
                         [--address 0.0.0.0:9092] [--workdir superlink/]
    flower-pfl supernode --superlink HOST:PORT --ca ca.crt --key keys/client-0.key
                         --partition-id 0 --data shards/0 --state-dir DIR
                         [--gpu 0] [--num-partitions N] [--port 9094] [--log FILE]
                         [--engine tuned|stock] [--config FILE [--set k=v ...]]
    flower-pfl submit    --superlink HOST:PORT --ca ca.crt [--config FILE] [--set k=v ...]
                         [--results DIR]

``superlink`` (server machine): Flower's SuperLink with TLS and SuperNode authentication,
the given public keys registered (a key's name is its file name), its state in
``--workdir`` (registered keys and runs survive a restart); stops what it started by PID.
``supernode`` (each client machine): Flower's SuperNode for one client, its
``--node-config`` built here with resolved paths; a shard folder's partition-id and
``num-partitions`` checked against its manifest before anything starts; a site's own data
(``data.dataset: site``: an image folder or a table file, no pool anywhere) checked to hold
samples, and with ``--config`` read and checked against the run's declared classes and shape
(:func:`site_data_line`); ``--gpu`` sets ``CUDA_VISIBLE_DEVICES``.  A refused activation is
an unregistered key (said, exit 1) or the SuperLink still counting this node online after
a crash (retried quietly for up to ``--rejoin-wait`` s): :func:`deploy.key_registered`
tells them apart.  ``submit`` (server machine, where the results are written): ``flwr
run`` with the YAML, its log streamed, exit 1 unless the run ends ``completed``; Ctrl-C
stops the run on the SuperLink too.

Logs hold no colour codes.  Exit status: 0 done; 1 failed (the reason printed); 2 bad
arguments, nothing started; 128+N stopped by signal N.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

from flower_pfl.config import APP_DIR
from flower_pfl.running import deploy
from flower_pfl.running.node_console import NodeConsole, foreground, say
from flower_pfl.running.procs import (
    LaunchError,
    ProcessSet,
    bin_path,
    flwr_env,
    run,
    stop_on_signals,
)

COMMANDS = ("superlink", "supernode", "submit")
CONNECTION = "site"
REJOIN_RETRY_S = 5.0
def _file(path: str, what: str) -> Path:
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise LaunchError(f"{what} {path}: no such file")
    return resolved


# ------------------------------------------------------------------------ superlink
def superlink_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flower-pfl superlink", description="Start the "
                                "SuperLink (TLS + SuperNode authentication) and register "
                                "the SuperNodes' public keys; runs until Ctrl-C.")
    p.add_argument("--certs", required=True, metavar="DIR",
                   help="folder with ca.crt, server.pem, server.key (flower-pfl certs)")
    p.add_argument("--keys-dir", metavar="DIR", help="register every *.pub in DIR")
    p.add_argument("--public-keys", nargs="+", default=[], metavar="FILE.pub",
                   help="register these public keys")
    p.add_argument("--address", default="0.0.0.0:9092",
                   help="HOST:PORT to listen on for SuperNodes and the flwr CLI "
                   "(default 0.0.0.0:9092)")
    p.add_argument("--workdir", default="superlink", metavar="DIR",
                   help="its database, log and flwr connection (default ./superlink)")
    return p


def superlink_main(argv: Sequence[str]) -> int:
    args = superlink_parser().parse_args(argv)
    try:
        certs = deploy.cert_paths(args.certs)
        host, port = deploy.split_address(args.address)
        keys = [_file(k, "public key") for k in args.public_keys]
        if args.keys_dir:
            folder = Path(args.keys_dir).expanduser().resolve()
            if not folder.is_dir():
                raise LaunchError(f"--keys-dir {args.keys_dir}: no such folder")
            keys += sorted(folder.glob("*.pub"))
        if not keys:
            raise LaunchError("no public keys to register (--keys-dir DIR or --public-keys "
                              "F.pub ...): with node authentication no SuperNode could join")
        names = [k.name[:-len(".pub")] if k.name.endswith(".pub") else k.stem for k in keys]
        if len(set(names)) != len(names):
            raise LaunchError(f"two public keys share a name: {sorted(names)}")
    except LaunchError as exc:
        say(str(exc))
        return 2
    workdir = Path(args.workdir).expanduser().resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    local = deploy.join_address(deploy.connect_host(host), port)
    env = flwr_env(workdir / "flwr-home", port)
    deploy.write_connection(workdir / "flwr-home", CONNECTION, local, certs["ca"])
    cmd = deploy.superlink_command(host, port, certs, workdir / "superlink.db")
    say(f"starting the SuperLink on {deploy.join_address(host, port)} (TLS: {certs['cert']}; "
        f"SuperNode authentication on; state in {workdir})")

    def ready(proc: subprocess.Popen[str]) -> None:
        deploy.wait_superlink(proc, host, port, certs["ca"])
        for key, name in zip(keys, names):
            state = deploy.register_key(key, name, CONNECTION, env)
            say(f"{state} SuperNode key {name} ({key})")
        say(f"SuperLink ready on {deploy.join_address(host, port)} with {len(keys)} "
            f"registered key(s). Submit a run from this machine with: flower-pfl submit "
            f"--superlink {local} --ca {certs['ca']} --config FILE. Ctrl-C stops it.")

    refused_keys: set[str] = set()

    def explain(line: str) -> None:  # Flower's own ERROR lines, said plainly (once per key)
        if "No SuperNode found with the given public key" in line:
            key_text = line.split("public key:", 1)[-1].split("exception:", 1)[0]
            if key_text in refused_keys:
                return
            refused_keys.add(key_text)
            say(f"a SuperNode whose key is not registered here was refused (its public key is "
                f"in the line above; the SuperNode is told so). To let it in, put its .pub "
                f"file in --keys-dir and restart, or: FLWR_HOME={workdir / 'flwr-home'} "
                f"{bin_path('flwr')} supernode register FILE.pub")
        elif "ApiError:2003" in line and "Heartbeat interval 0.0 is out of bounds" in line:
            say("(the line above is a refused SuperNode asking whether its key is registered "
                "here: it is; nothing was changed)")

    return foreground(cmd, deploy.superlink_env(env), "SuperLink", explain,
                      workdir / "superlink.log", ready)


# ------------------------------------------------------------------------ supernode
def supernode_plan(args: argparse.Namespace) -> tuple[list[str], dict[str, str], str]:
    """The ``flower-supernode`` command, its environment and a line saying what it is."""
    from flower_pfl.learning import shards

    if args.partition_id < 0:
        raise LaunchError(f"--partition-id {args.partition_id}: must be >= 0")
    ca = key = None
    if not args.insecure:
        if not args.ca or not args.key:
            raise LaunchError("--ca ca.crt and --key <node key> are needed (TLS and node "
                              "authentication); --insecure only for local experiments")
        ca, key = _file(args.ca, "--ca"), _file(args.key, "--key")
    num = args.num_partitions
    data, about_data = None, "data: the dataset of this machine (no --data)"
    if args.data:
        data = Path(args.data).expanduser().resolve()
        if shards.is_shard_folder(data):
            m = shards.read_manifest(data)
            if m.get("partition-id") != args.partition_id:
                raise LaunchError(f"--data {args.data} holds the shard of partition-id "
                                  f"{m.get('partition-id')}, not --partition-id "
                                  f"{args.partition_id}")
            if num is not None and num != m.get("num-partitions"):
                raise LaunchError(f"--num-partitions {num} but the shard in {args.data} is "
                                  f"one of {m.get('num-partitions')}")
            num = int(m["num-partitions"])
            about_data = (f"data: shard {data} ({m['counts']['train']} train + "
                          f"{m['counts']['test']} test samples of {m['dataset']}, "
                          f"settings-hash {m['settings-hash']})")
        else:
            about_data = site_data_line(args, data)
    if num is None:
        raise LaunchError("--num-partitions N is needed (the run's `clients`) unless --data "
                          "is a shard folder made by `flower-pfl partition`")
    if args.partition_id >= num:
        raise LaunchError(f"--partition-id {args.partition_id} is outside [0, {num})")
    if args.gpu is not None:
        deploy.check_gpus([args.gpu], "--gpu")
    state_dir = Path(args.state_dir).expanduser().resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    deploy.split_address(args.superlink)  # HOST:PORT or a clear error
    config = deploy.node_config(args.partition_id, num, state_dir, data)
    cmd = deploy.supernode_command(args.superlink, args.port, config, ca, key,
                                   args.max_retries, engine=args.engine)
    env = flwr_env(Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr")), args.port)
    if args.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = args.gpu  # its ClientApp processes inherit it
    security = (f"TLS, CA {ca}; node key {key}" if ca else "INSECURE: no TLS, no node auth")
    device = f"GPU {args.gpu} (CUDA_VISIBLE_DEVICES)" if args.gpu is not None else \
        node_device(args)
    about = (f"SuperNode for partition-id {args.partition_id} of {num} -> SuperLink "
             f"{args.superlink} ({security}); {about_data}; state-dir {state_dir}; "
             f"device {device}; engine {args.engine}")
    return cmd, env, about


def node_device(args: argparse.Namespace) -> str:
    """The device this node's clients will train on, as far as it can know at start (no
    ``--gpu``): the run's ``device`` where ``--config`` gives the run's YAML, and where it
    asks for CUDA on a machine without one, that its fits will fail and the fix."""
    if not args.config:
        return "the run's device (its YAML's device key; no --gpu)"
    from flower_pfl import config as config_mod

    try:
        want = config_mod.load(Path(args.config), args.set or None)["device"]
    except config_mod.ConfigError as exc:
        raise LaunchError(f"--config {args.config}: {exc}") from exc
    if want != "cuda":
        return f"{want} (device in {args.config})"
    import torch

    if torch.cuda.is_available():
        return f"cuda (device in {args.config}; {torch.cuda.device_count()} visible)"
    return (f"cuda (device in {args.config}) -- BUT THIS MACHINE HAS NO CUDA DEVICE (torch "
            f"{torch.__version__}): every fit and evaluation sent here will fail. Fix: "
            f"device: auto in the run's YAML (CUDA where a node has one, else the CPU), or "
            f"start this node on a machine with a GPU")


def site_data_line(args: argparse.Namespace, data: Path) -> str:
    """What ``--data`` (not a shard) is, checked as far as this machine can: a site's own
    folder or file must exist and hold samples; with ``--config`` of a ``data.dataset:
    site`` run it is read and checked against the run's classes and shape (LaunchError)."""
    from flower_pfl.learning import site_data

    problem = site_data.local_problem(data)
    if problem is not None:
        raise LaunchError(f"--data {args.data}: {problem}")
    cfg = None
    if args.config:
        from flower_pfl import config as config_mod

        try:
            cfg = config_mod.load(Path(args.config), args.set or None)
        except config_mod.ConfigError as exc:
            raise LaunchError(f"--config {args.config}: {exc}") from exc
    if cfg is None or cfg["data.dataset"] != site_data.SITE:
        kind = "table file" if data.is_file() else "folder"
        return (f"data: {kind} {data} (this site's own data in a data.dataset: site run, else "
                f"the dataset's files{'' if cfg is None else ' of ' + cfg['data.dataset']})")
    try:
        line = site_data.describe(data, cfg.values, args.partition_id)
    except site_data.SiteError as exc:
        raise LaunchError(f"--data {args.data} cannot serve this run: {exc}") from exc
    return f"data: this site's own {data}: {line} (checked against {args.config})"


def supernode_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flower-pfl supernode", description="Start this client "
                                "machine's SuperNode; runs until Ctrl-C.")
    p.add_argument("--superlink", required=True, metavar="HOST:PORT")
    p.add_argument("--ca", help="the CA certificate of the SuperLink's server certificate")
    p.add_argument("--key", help="this node's private key (flower-pfl node-key); its public "
                   "key must be registered on the SuperLink")
    p.add_argument("--partition-id", type=int, required=True, help="this client's identity")
    p.add_argument("--num-partitions", type=int, default=None,
                   help="the run's `clients` (default: from the shard's manifest)")
    p.add_argument("--data", metavar="PATH", help="this client's shard (flower-pfl partition "
                   "--out DIR: DIR/<partition-id>), a dataset folder, or this site's own "
                   "data for a run with data.dataset: site (an image folder or a CSV/"
                   "Parquet/NPZ file; docs/own-data.md)")
    p.add_argument("--config", metavar="FILE", help="the run's YAML (optional): with "
                   "data.dataset: site, --data is read and checked against it (classes, "
                   "shape, samples) before the SuperNode starts")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="overrides of --config's keys")
    p.add_argument("--state-dir", required=True, metavar="DIR",
                   help="where the client keeps its personal state (a restart continues it)")
    p.add_argument("--gpu", default=None, metavar="ID", help="the CUDA device to train on "
                   "(CUDA_VISIBLE_DEVICES; refused on a machine without CUDA)")
    p.add_argument("--port", type=int, default=9094,
                   help="local port for its ClientApp processes (one per SuperNode on a "
                   "machine; default 9094)")
    p.add_argument("--max-retries", type=int, default=None,
                   help="give up after this many failed connection attempts (default: never)")
    p.add_argument("--rejoin-wait", type=float, default=120, metavar="S",
                   help="after a crash the SuperLink refuses this node until it has missed two "
                   "heartbeats: keep trying for this long (default 120 s)")
    p.add_argument("--log", metavar="FILE", default=None,
                   help="the SuperNode's full output, tracebacks included (default: "
                   "supernode.log in --state-dir); the console shows one line per failed "
                   "message")
    p.add_argument("--engine", choices=("tuned", "stock"), default="tuned",
                   help="tuned (default): Flower's SuperNode with its fixed waits shortened "
                   "(checked against this Flower, else as released; docs/engine.md); stock: "
                   "Flower's flower-supernode as released")
    p.add_argument("--insecure", action="store_true", help="no TLS, no node auth (testing)")
    return p


def public_key_of(key: Path) -> str:
    """Where ``flower-pfl node-key`` put the public key of ``key`` (for the hints)."""
    pub = key.with_suffix(".pub")
    return str(pub) if pub.is_file() else f"the public key of {key}"


def unregistered_hint(key: Path, superlink: str) -> str:
    pub = public_key_of(key)
    return (f"the SuperLink at {superlink} refuses this node: its key {key} is not registered "
            f"there (the SuperLink logs \"No SuperNode found with the given public key\"). "
            f"Register it on the server: put {pub} in the --keys-dir of `flower-pfl superlink` "
            f"and restart it (registered keys are kept), or register it on the running one "
            f"with `FLWR_HOME=superlink/flwr-home .venv/bin/flwr supernode register "
            f"{Path(pub).name}`; then start this SuperNode again")


def supernode_main(argv: Sequence[str]) -> int:
    args = supernode_parser().parse_args(argv)
    try:
        cmd, env, about = supernode_plan(args)
    except LaunchError as exc:
        say(str(exc))
        return 2
    state_dir = Path(args.state_dir).expanduser().resolve()
    log_path = Path(args.log).expanduser().resolve() if args.log else state_dir / "supernode.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    say(f"{about}; full log {log_path}")
    ca = None if args.insecure else Path(args.ca).expanduser().resolve()
    key = None if args.insecure else Path(args.key).expanduser().resolve()
    announced, refused = threading.Event(), threading.Event()

    def on_line(line: str) -> None:
        match = re.search(r"SuperNode ID: (\S+)", line)
        if match and not announced.is_set():
            announced.set()
            say(f"connected to the SuperLink at {args.superlink} as node {match.group(1)} "
                f"(partition-id {args.partition_id})")
        if "Failed to activate SuperNode" in line:
            refused.set()

    # Refused activation has two causes Flower does not tell apart on this side: the key is
    # not registered, or the SuperLink still counts this node online (after a crash it keeps
    # it ONLINE until 2 heartbeats, 30 s each, are missed, and refuses it until then). The
    # SuperLink is asked which (deploy.key_registered) after the first refusal.
    registered: bool | None = None
    deadline = time.time() + args.rejoin_wait
    attempt = 0
    while True:
        refused.clear()
        attempt += 1
        code = foreground(cmd, env, "SuperNode", on_line, log_path=log_path,
                           explain=lambda: not refused.is_set(),
                           console=NodeConsole(log_path, hold=attempt > 1))
        if code == 0 or not refused.is_set():
            return code
        if attempt == 1:
            registered = True if key is None else deploy.key_registered(args.superlink, ca, key)
            if registered is False:
                assert key is not None, "False comes from key_registered(key) alone"
                say(unregistered_hint(key, args.superlink))
                return 1
            if registered:
                say(f"the SuperLink refuses to activate this node although its key is "
                    f"registered: it still counts this node as online (its previous SuperNode "
                    f"stopped without signing off, and the SuperLink waits for 2 missed "
                    f"heartbeats, up to a minute). Trying again every {REJOIN_RETRY_S:.0f} s "
                    f"for up to {args.rejoin_wait:.0f} s (--rejoin-wait)")
            else:
                assert key is not None, "None comes from key_registered(key) alone"
                say(f"the SuperLink refuses to activate this node and could not be asked why. "
                    f"Either its key {key} is not registered there (register "
                    f"{public_key_of(key)} with `flower-pfl superlink --keys-dir`), or the "
                    f"SuperLink still counts this node as online after a crash (that passes "
                    f"within a minute). Trying again every {REJOIN_RETRY_S:.0f} s for up to "
                    f"{args.rejoin_wait:.0f} s (--rejoin-wait)")
        if time.time() > deadline:
            why = ("the key is registered, so another SuperNode with this key is probably "
                   "running: stop it, or give this machine its own key (flower-pfl node-key)"
                   if registered else "see above")
            say(f"the SuperLink still refuses to activate this node after {attempt} attempts "
                f"in {args.rejoin_wait:.0f} s; giving up ({why})")
            return 1
        try:
            time.sleep(REJOIN_RETRY_S)
        except KeyboardInterrupt as exc:
            return 128 + getattr(exc, "signum", signal.SIGINT)


# --------------------------------------------------------------------------- submit
def submit_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flower-pfl submit", description="Run a YAML on a "
                                "running SuperLink and check that it completed.")
    p.add_argument("--superlink", default="127.0.0.1:9092", metavar="HOST:PORT")
    p.add_argument("--ca", help="the CA certificate of the SuperLink's server certificate")
    p.add_argument("--insecure", action="store_true", help="the SuperLink has no TLS")
    p.add_argument("--config", default=str(APP_DIR / "simulation.yaml"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--results", metavar="DIR", help="results folder (default: from the YAML)")
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--quiet", action="store_true", help="do not echo Flower's log")
    return p


def submit_main(argv: Sequence[str]) -> int:
    from flower_pfl import config as config_mod
    from flower_pfl.reliability.preflight import PreflightError, check_before_start
    from flower_pfl.reporting.console import summary_lines
    from flower_pfl.reporting.results import mark_failed
    from flower_pfl.reporting.run_dirs import default_results_dir

    args = submit_parser().parse_args(argv)
    try:
        deploy.split_address(args.superlink)
        if not args.insecure and not args.ca:
            raise LaunchError("--ca ca.crt is needed (or --insecure for a SuperLink without TLS)")
        ca = None if args.insecure else _file(args.ca, "--ca")
        cfg = config_mod.load(Path(args.config), args.set or None)
        results = Path(args.results).expanduser().resolve() if args.results else \
            default_results_dir(cfg)
        # what this machine can see: the folders, the data sizes (the nodes check their own
        # device when they start: flower-pfl supernode)
        check_before_start(cfg, "remote", results)
    except (LaunchError, config_mod.ConfigError, PreflightError) as exc:
        say(str(exc))
        return 2
    home = Path(tempfile.mkdtemp(prefix="flower-pfl-submit-"))
    env = flwr_env(home / "flwr-home", 0)
    deploy.write_connection(home / "flwr-home", CONNECTION, args.superlink, ca)
    run_id: list[str] = []

    def on_line(line: str) -> None:
        match = re.search(r"Successfully started run (\d+)", line)
        if match:
            run_id.append(match.group(1))

    split = ("own data per site" if cfg["data.dataset"] == "site"
             else f"{cfg['data.partition']} partition")
    say(f"{cfg.strategy} on {cfg['data.dataset']} ({split}), {cfg['clients']} "
        f"clients, {cfg['rounds']} rounds -> SuperLink {args.superlink}; results {results}")
    procs = ProcessSet()
    stop_on_signals()
    try:
        out = deploy.submit_run(env, CONNECTION, Path(args.config), args.set, results, home,
                                procs, timeout_s=args.timeout, echo=not args.quiet,
                                on_line=on_line, stall_s=cfg["stall-timeout"])
    except (LaunchError, KeyboardInterrupt) as exc:
        if run_id:  # the run lives on the SuperLink: stop it there too (no-op when finished)
            run([bin_path("flwr"), "stop", run_id[0], CONNECTION], env=env,
                capture_output=True, timeout=60)
        if isinstance(exc, LaunchError):
            mark_failed(results, exc)  # where the ServerApp could not say so itself
            print("\n".join(summary_lines(results)), flush=True)
            say(f"FAILED: {exc}")
            return 1
        say(f"stopped{' run ' + run_id[0] if run_id else ''}")
        return 128 + getattr(exc, "signum", signal.SIGINT)
    finally:
        procs.stop()
        shutil.rmtree(home, ignore_errors=True)
    say(f"run {out.run_id} completed. Results: {results}")
    print("\n".join(summary_lines(results)), flush=True)  # coverage where not all, numbers
    return 0


def main(argv: Sequence[str]) -> int:
    """``argv``: the command (one of :data:`COMMANDS`) and its arguments."""
    command, rest = argv[0], list(argv[1:])
    return {"superlink": superlink_main, "supernode": supernode_main,
            "submit": submit_main}[command](rest)
