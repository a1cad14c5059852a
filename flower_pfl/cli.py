"""``flower-pfl``: run, check and benchmark personalized FL on Flower (the command line).

    flower-pfl run [--config simulation.yaml] [--set key=value ...] [--resume RESULTS_DIR]
    flower-pfl validate [--config FILE] [--set key=value ...]
    flower-pfl strategies
    flower-pfl partition [--config FILE] [--set key=value ...] --out DIR   (flower_pfl/shards.py)
    flower-pfl bench MATRIX.yaml [--seeds ...] [--set key=value ...]   (flower_pfl/bench.py)
    flower-pfl certs DIR | node-key DIR NAME | deploy ...                 (flower_pfl/deploy.py)
    flower-pfl superlink | supernode | submit ...                         (flower_pfl/sites.py)

Only this module parses arguments and turns outcomes into exit statuses (0 done; 1 the run
failed; 2 a bad configuration or argument, nothing started; 128+N stopped by signal N); the
modules it calls -- launch (``run``: one simulation), bench and tables, deploy, sites,
shards -- are libraries and never import it.

``run`` is the one source of truth for the client count: it validates the YAML first
(one clear error, nothing started), then :func:`flower_pfl.launch.run_simulation` starts a
private SuperLink, runs ``flwr run`` with ``num-supernodes`` and client resources taken
from the YAML, checks the run's FINAL status and stops every process it started by PID,
also on failure, Ctrl-C, SIGTERM or SIGHUP.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Sequence

from flower_pfl import config as config_mod
from flower_pfl import registry
from flower_pfl.bench import run_bench
from flower_pfl.launch import resume_config, run_simulation
from flower_pfl.matrix import MatrixError, load_matrix
from flower_pfl.procs import APP_DIR, LaunchError, Terminated, stop_on_signals
from flower_pfl.reliability import preflight
from flower_pfl.tables import collect, write_plots, write_table


def main(argv: Sequence[str] | None = None) -> int:
    """``flower-pfl COMMAND ...``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # strategies x settings x seeds: its own parser
        return bench_main(argv[1:])
    if argv[:1] in (["superlink"], ["supernode"], ["submit"]):  # one command per machine
        from flower_pfl.sites import main as sites_main

        return sites_main(argv)
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
            cfg, resume_yaml = resume_config(
                resume_dir, Path(args.config) if args.config_given else None, args.set or [])
        else:
            cfg = config_mod.load(Path(args.config), args.set or None)
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


def bench_main(argv: Sequence[str] | None = None) -> int:
    """``flower-pfl bench MATRIX.yaml ...`` (flower_pfl/bench.py, flower_pfl/matrix.py)."""
    p = argparse.ArgumentParser(prog="flower-pfl bench",
                                description="strategies x settings x seeds, each cell a real "
                                "run; resumes where it stopped")
    p.add_argument("matrix", help="the matrix YAML file (see benchmarks/*.yaml)")
    p.add_argument("--out", default=None,
                   help="output folder (default: bench-results/<matrix name> in the cwd)")
    p.add_argument("--strategies", nargs="+", help="run only these strategies' cells")
    p.add_argument("--settings", nargs="+", help="run only these settings' cells")
    p.add_argument("--seeds", nargs="+", type=int, help="run only these seeds' cells")
    p.add_argument("--table-only", action="store_true", help="run nothing; rewrite table/plots")
    p.add_argument("--superlink", choices=("shared", "per-cell"), default="shared",
                   help="one SuperLink for all cells (default) or one per run")
    p.add_argument("--ray", choices=("per-run", "shared"), default="per-run",
                   help="each run starts its own Ray instance (default, as flower-pfl run) or "
                   "all runs attach to one started for the bench (needs --superlink shared)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one key in every cell (repeatable), e.g. --set rounds=20; "
                   "recorded in each cell.yaml and in table.md")
    p.add_argument("--timeout", type=float, default=None, help="seconds per cell before failing")
    p.add_argument("--retries", type=int, default=1,
                   help="run a failed or invalid (clients failed) cell again up to N times")
    p.add_argument("--echo", action="store_true", help="echo Flower's log of every run")
    args = p.parse_args(argv)
    try:
        matrix = load_matrix(args.matrix, config_mod.parse_overrides(args.set))
    except (MatrixError, config_mod.ConfigError) as exc:
        print(f"flower-pfl bench: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("bench-results") / matrix.name).resolve()
    if args.table_only:
        cells = matrix.cells(out)
        records = collect(matrix, cells)
        out.mkdir(parents=True, exist_ok=True)
        write_table(matrix, records, out)
        write_plots(matrix, cells, records, out)
        print(f"[bench] table: {out / 'table.md'}")
        return 0
    only = {"strategy": args.strategies, "setting": args.settings, "seed": args.seeds}
    # Ctrl-C, SIGTERM and SIGHUP all unwind through the SuperLink/Ray contexts (every process
    # stopped by PID); SIGINT is re-enabled because a shell's background job inherits it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop_on_signals()
    try:
        records = run_bench(matrix, out, args.superlink, args.echo, args.timeout, only,
                            ray=args.ray, retries=args.retries)
    except KeyboardInterrupt:
        print("flower-pfl bench: interrupted; processes stopped (rerun to resume)",
              file=sys.stderr)
        return 130
    return 1 if any(r["status"] == "failed" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
