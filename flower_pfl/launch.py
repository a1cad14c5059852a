"""``flower-pfl``: validate a config and run it in Ray simulation, then clean up.

    flower-pfl run [--config simulation.yaml] [--set key=value ...]
    flower-pfl validate [--config FILE] [--set key=value ...]
    flower-pfl strategies
    flower-pfl partition [--config FILE] [--set key=value ...] --out DIR   (flower_pfl/shards.py)
    flower-pfl bench MATRIX.yaml [--seeds ...] [--set key=value ...]   (flower_pfl/bench.py)

``run`` is the one source of truth for the client count: it validates the YAML first
(one clear error, nothing started), starts a private SuperLink (its own FLWR_HOME and
loopback port, runtime dependency installation off), calls ``flwr run`` with
``num-supernodes`` and client resources taken from the YAML, checks the run's FINAL
status (``flwr run --stream`` exits 0 even when the run failed) and stops every process
it started -- SuperLink, SuperExec, ServerApp, Ray -- by PID, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from flower_pfl import config as config_mod
from flower_pfl import registry
from flower_pfl.procs import (
    APP_DIR,
    LaunchError,
    ProcessSet,
    RunOutcome,
    Terminated,
    _alive,  # noqa: F401 - re-exported: tests/test_deployment.py, test_e2e_simulation.py import it
    _bin,
    _stream,
    flwr_env,
    free_port,
    run_status,
    stop_on_signals,
    toml_string,
    wait_http,
)
from flower_pfl.reliability import preflight


# ------------------------------------------------------------------------ processes
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
def run_simulation(cfg: config_mod.RunConfig, config_path: Path, overrides: Sequence[str],
                   results_dir: Path, app_dir: Path = APP_DIR, timeout_s: float | None = None,
                   echo: bool = True, num_supernodes: int | None = None, resume: bool = False,
                   on_line=None, superlink: tuple[dict, ProcessSet] | None = None
                   ) -> RunOutcome:
    """Run ``cfg`` through ``flwr run`` in Ray simulation and stop everything it started.

    ``num_supernodes`` defaults to the YAML's ``clients`` (only tests set another value).
    ``resume`` continues the run in ``results_dir`` from its newest checkpoint. The
    watchdog stops a run that shows no progress for ``stall-timeout`` seconds.
    ``superlink``: the ``(env, procs)`` of a running :func:`simulation_superlink` to run
    on (several runs share one); by default a private one is started and stopped.
    The outcome's ``pids`` are the processes this run started (a private SuperLink
    included, a shared one not).
    Raises LaunchError if the run did not reach ``finished:completed``.
    """
    results_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="flower-pfl-"))
    run_config = workdir / "run-config.toml"
    run_config.write_text(
        f"config-file = {toml_string(str(config_path.resolve()))}\n"
        f"overrides = {toml_string(' '.join(overrides))}\n"
        f"results-dir = {toml_string(str(results_dir.resolve()))}\n"
        f"resume = {'true' if resume else 'false'}\n"
        # the clients' personal state lives in their (Ray) processes: mirror it here so that
        # checkpoints hold it and a resumed run gets it back
        f"client-state-dir = {toml_string(str((results_dir / 'client-state').resolve()))}\n")
    federation = (f"num-supernodes={num_supernodes or cfg['clients']} "
                  f"client-resources-num-cpus={cfg['client-resources.num-cpus']} "
                  f"client-resources-num-gpus={cfg['client-resources.num-gpus']}")
    log_path = results_dir / "flwr-run.log"
    try:
        with ExitStack() as stack:
            before: set[int] = set()
            if superlink is None:
                superlink = stack.enter_context(
                    simulation_superlink(workdir, results_dir / "superlink.log"))
            else:  # the shared SuperLink and what it ran before are not this run's
                superlink[1].snapshot()
                before = set(superlink[1].known)
            env, procs = superlink
            cmd = [_bin("flwr"), "run", str(app_dir), "local", "--stream",
                   "--federation-config", federation, "--run-config", str(run_config)]
            run_id = _stream(cmd, env, log_path, echo, timeout_s, procs, on_line=on_line,
                             stall_s=cfg["stall-timeout"], append=resume)
            status = run_status(run_id, env) if run_id else "unknown"
            procs.snapshot()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if status != "finished:completed":
        raise LaunchError(f"run {run_id or '?'} ended with status '{status}'; see {log_path}")
    return RunOutcome(status, run_id, set(procs.known) - before)


# ----------------------------------------------------------------------------- CLI
def _load(args) -> config_mod.RunConfig:
    return config_mod.load(Path(args.config), args.set or None)


def resume_config(results_dir: Path, args=None) -> tuple[config_mod.RunConfig, Path]:
    """The configuration a results folder was written with, as a YAML file the ServerApp
    reads (``<results>/resume.yaml``); with ``--config``/``--set`` given, they must give
    the same configuration."""
    from flower_pfl import reliability

    folder = reliability.latest_checkpoint(results_dir)
    if folder is None:
        raise config_mod.ConfigError(f"--resume {results_dir}: no checkpoint there (runs write "
                                     f"one every 'checkpoint-every' rounds)")
    saved = reliability.read_checkpoint(folder)["config"]
    tree: dict = {}
    for dotted, value in saved["values"].items():
        node = tree
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    tree["hyper"] = {saved["values"]["strategy"]: dict(saved["hyper"])}
    path = results_dir / "resume.yaml"
    import yaml

    path.write_text(yaml.safe_dump(tree, sort_keys=True))
    cfg = config_mod.load(path)
    if args is not None and (args.set or args.config_given):
        given = config_mod.load(Path(args.config), args.set or None)
        diff = sorted(k for k in set(given.values) | set(cfg.values)
                      if given.values.get(k) != cfg.values.get(k))
        if given.hyper != cfg.hyper:
            diff.append("hyper")
        if diff:
            raise config_mod.ConfigError(f"--resume {results_dir}: that run was written by a "
                                         f"different configuration (differs in: "
                                         f"{', '.join(diff)})")
    return cfg, path


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # strategies x settings x seeds: its own parser
        from flower_pfl.bench import main as bench_main

        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="flower-pfl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("bench", help="run a matrix of strategies x settings x seeds "
                   "(flower-pfl bench MATRIX.yaml --help)")
    for name in ("run", "validate"):
        p = sub.add_parser(name)
        p.add_argument("--config", default=str(APP_DIR / "simulation.yaml"),
                       help="the run's YAML file (default: the app's simulation.yaml)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override one key for this run (repeatable), e.g. --set rounds=5")
        if name == "run":
            p.add_argument("--timeout", type=float, default=None, help="seconds before giving up")
            p.add_argument("--quiet", action="store_true", help="do not echo Flower's log")
            p.add_argument("--resume", metavar="RESULTS_DIR", default=None,
                           help="continue a stopped run from its newest checkpoint (its own "
                           "configuration is used; --config/--set must match it if given)")
    sub.add_parser("strategies")
    p = sub.add_parser("partition", help="write each client's data shard to DIR/<partition-id>/ "
                       "(data per site in deployment)")
    p.add_argument("--config", default=str(APP_DIR / "simulation.yaml"),
                   help="the run's YAML file (default: the app's simulation.yaml)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one key (repeatable), as for run")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the shards")
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
    argv_list = list(sys.argv[1:] if argv is None else argv)
    args.config_given = "--config" in argv_list

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
    resume_dir = Path(args.resume).resolve() if getattr(args, "resume", None) else None
    try:
        if resume_dir is not None:
            cfg, resume_yaml = resume_config(resume_dir, args)
        else:
            cfg = _load(args)
    except config_mod.ConfigError as exc:
        print(f"flower-pfl: {exc}", file=sys.stderr)
        return 2
    if args.command == "partition":
        from flower_pfl.shards import partition_command

        return partition_command(cfg.values, args.out, args.config, args.set or [])
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
        stop_on_signals()
        try:
            deploy(Path(args.config), args.set or [], results_dir, cfg["clients"],
                   None if args.insecure else Path(args.certs),
                   [g for g in args.gpus.split(",") if g], args.data_root, args.timeout)
        except LaunchError as exc:
            print(f"flower-pfl: FAILED: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt as exc:
            print("flower-pfl: stopped; every process of the deployment stopped", file=sys.stderr)
            return 128 + getattr(exc, "signum", signal.SIGINT)
        print(f"flower-pfl: deployment run completed. Results: {results_dir}")
        return 0
    from strategies.base import default_results_dir

    results_dir = resume_dir or default_results_dir(cfg)
    try:
        preflight(cfg, results_dir)
    except Exception as exc:  # noqa: BLE001 - PreflightError, DataError: one clear line
        print(f"flower-pfl: cannot start: {exc}", file=sys.stderr)
        return 2
    print(f"flower-pfl: {cfg.strategy} on {cfg['data.dataset']}/{cfg['data.partition']}, "
          f"{cfg['clients']} clients, {cfg['rounds']} rounds -> {results_dir}"
          f"{' (resumed)' if resume_dir else ''}", flush=True)
    stop_on_signals()
    try:
        if resume_dir is not None:
            run_simulation(cfg, resume_yaml, [], results_dir, timeout_s=args.timeout,
                           echo=not args.quiet, resume=True)
        else:
            run_simulation(cfg, Path(args.config), args.set or [], results_dir,
                           timeout_s=args.timeout, echo=not args.quiet)
    except LaunchError as exc:
        print(f"flower-pfl: FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (procs.Terminated)
        name = exc.args[0] if isinstance(exc, Terminated) else "interrupted"
        print(f"flower-pfl: {name}; every process of the run stopped. Continue with "
              f"`flower-pfl run --resume {results_dir}`", file=sys.stderr)
        return 128 + getattr(exc, "signum", signal.SIGINT)
    print(f"flower-pfl: run completed. Results: {results_dir}/rounds.csv (per round), "
          f"{results_dir}/clients.csv (per client), {results_dir}/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
