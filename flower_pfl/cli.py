"""``flower-pfl``: run, check and benchmark personalized FL on Flower (the command line).

    flower-pfl run [--config simulation.yaml] [--set key=value ...] [--resume RESULTS_DIR]
                   [--engine tuned|stock] [--tensorboard DIR] [--verbose | --quiet]
                   [--ray-address HOST:PORT]
    flower-pfl validate [--config FILE] [--set key=value ...] [--engine tuned|stock]
    flower-pfl strategies [NAME]
    flower-pfl compare RUN_DIR ... [--metric KEY ...] [--out DIR]  (reporting/compare.py)
    flower-pfl partition [--config FILE] [--set key=value ...] --out DIR   (learning/shards.py)
    flower-pfl bench MATRIX.yaml [--seeds ...] [--set key=value ...]   (flower_pfl/running/bench.py)
    flower-pfl certs DIR | node-key DIR NAME | deploy ...                 (running/deploy.py)
    flower-pfl superlink | supernode | submit ...                         (running/sites.py)

Only this module parses arguments and turns outcomes into exit statuses (0 done; 1 the run
failed; 2 a bad configuration or argument, nothing started; 128+N stopped by signal N); the
modules it calls -- launch (``run``: one simulation), bench and tables, deploy, sites,
shards -- are libraries and never import it.  What ``run`` and ``bench`` print while a
federation runs: :mod:`flower_pfl.reporting.console` (``--verbose``: Flower's and Ray's own log).

``run`` is the one source of truth for the client count: it validates the YAML first
(one clear error, nothing started; a bad ``--set`` is named as such), then
:func:`flower_pfl.running.launch.run_simulation` starts a private SuperLink, runs ``flwr run``
with ``num-supernodes`` and client resources taken from the YAML, checks the run's FINAL
status and stops every process it started by PID, also on failure, Ctrl-C, SIGTERM or
SIGHUP.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Sequence

from flower_pfl import cli_parser, initial_model, raynode, registry
from flower_pfl import config as config_mod
from flower_pfl.matrix import MatrixError, load_matrix
from flower_pfl.reliability import checkpoints, stop
from flower_pfl.reliability.preflight import PreflightError, check_before_start
from flower_pfl.reliability.preflight_apart import preflight_apart
from flower_pfl.reporting import tracking
from flower_pfl.reporting.console import BenchConsole, RunConsole, summary_lines
from flower_pfl.reporting.results import mark_failed
from flower_pfl.reporting.run_dirs import new_results_dir
from flower_pfl.reporting.run_files import read_summary
from flower_pfl.reporting.tables import collect, write_plots, write_table
from flower_pfl.running.bench import run_bench
from flower_pfl.running.launch import (
    AlreadyCompleted,
    check_ray_address,
    resume_config,
    run_simulation,
)
from flower_pfl.running.procs import LaunchError, StopAfterRound, Terminated, stop_on_signals

WIDTH = 100  # the strategies list fits a terminal this wide


def build_parser() -> argparse.ArgumentParser:
    """``flower-pfl``'s parser (:mod:`flower_pfl.cli_parser`)."""
    return cli_parser.build_parser(__doc__.split("\n")[0])


def main(argv: Sequence[str] | None = None) -> int:
    """``flower-pfl COMMAND ...``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # strategies x settings x seeds: its own parser
        return bench_main(argv[1:])
    if argv[:1] in (["superlink"], ["supernode"], ["submit"]):  # one command per machine
        from flower_pfl.running.sites import main as sites_main

        return sites_main(argv)
    args = build_parser().parse_args(argv)
    args.config_given = any(a == "--config" or a.startswith("--config=") for a in argv)

    if args.command == "certs":
        from flower_pfl.running.certs import LOOPBACK, make_ca

        paths = make_ca(args.dir, args.host or ())
        print("\n".join(f"{k}: {v}" for k, v in paths.items()))
        print(f"the server certificate names: "
              f"{', '.join(dict.fromkeys([*(args.host or ()), *LOOPBACK]))}")
        return 0
    if args.command == "node-key":
        from flower_pfl.running.certs import make_node_key

        private, public = make_node_key(args.dir, args.name)
        print(f"private: {private}\npublic:  {public}")
        return 0
    if args.command == "strategies":
        return strategies_command(args.name)
    if args.command == "compare":
        return compare_command(args)
    resume_dir = Path(args.resume).resolve() if getattr(args, "resume", None) else None
    sets = list(args.set or []) + ([f"engine={args.engine}"] if getattr(args, "engine", None)
                                   else [])
    if getattr(args, "tensorboard", None):  # tracking changes no result: it may join a resume
        sets += ["tracking=tensorboard",
                 f"tracking-dir={Path(args.tensorboard).expanduser().resolve()}"]
    try:
        if resume_dir is not None:  # --set/--config compared with the run's own configuration
            cfg, resume_yaml = resume_config(
                resume_dir, Path(args.config) if args.config_given else None, sets)
        else:
            cfg = load_config(Path(args.config), sets)
    except AlreadyCompleted as exc:
        print(f"flower-pfl: {exc}")
        return 0
    except config_mod.ConfigError as exc:
        print(f"flower-pfl: {exc}", file=sys.stderr)
        return 2
    if args.command == "partition":
        from flower_pfl.learning.shards import partition_command

        return partition_command(cfg.values, args.out, args.config, args.set or [])
    if args.command == "validate":  # what `run` checks before it starts, nothing created
        try:
            preflight_apart(cfg, new_results_dir(cfg))
        except Exception as exc:  # noqa: BLE001 - PreflightError, FileExistsError
            given = "".join(f" --set {s}" for s in sets)  # the reason first, then the echo
            print(f"flower-pfl: cannot start: {exc}\n  (`flower-pfl run` would refuse it "
                  f"here; the configuration, {args.config}{given}, passes validation)",
                  file=sys.stderr)
            return 2
        print(f"{args.config}: OK (strategy {cfg.strategy}, {cfg['clients']} clients, "
              f"{cfg['rounds']} rounds)")
        from flower_pfl.learning.data_summary import describe

        for line in describe(cfg.values):  # what was inferred: classes, features, clients
            print(f"  {line}")
        return 0
    if args.command == "deploy":
        return deploy_command(args, cfg)
    if resume_dir is not None:
        return run_command(args, cfg, resume_yaml, [], resume_dir)
    return run_command(args, cfg, Path(args.config), sets, None)


def load_config(path: Path, sets: Sequence[str]) -> config_mod.RunConfig:
    """The YAML file with ``--set`` overrides; where the file alone is valid, an error is
    the overrides' and says so (not "in simulation.yaml")."""
    try:
        return config_mod.load(path, list(sets) or None)
    except config_mod.ConfigError as exc:
        if not sets:
            raise
        try:
            config_mod.load(path)
        except config_mod.ConfigError:
            raise exc from None
        problems = str(exc).split("\n", 1)[1] if "\n" in str(exc) else f"  - {exc}"
        raise config_mod.ConfigError(
            f"invalid --set {' '.join(sets)} (on top of {path}, which is valid):\n"
            f"{problems}") from None


def strategies_command(name: str | None) -> int:
    """The registered strategies, one line each; with ``name``: that one in full."""
    width = min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)
    if name is None:
        pad = max(len(n) for n in registry.REGISTRY) + 2
        for entry in registry.REGISTRY.values():
            print(f"{entry.name:{pad}s}" + textwrap.shorten(entry.summary, width=width - pad,
                                                             placeholder=" ..."))
        print(f"\n{len(registry.REGISTRY)} strategies. `flower-pfl strategies NAME`: one "
              f"strategy's description and hyper-parameters.")
        return 0
    if name not in registry.REGISTRY:
        from flower_pfl.hyper import did_you_mean

        print(f"flower-pfl: unknown strategy '{name}'{did_you_mean(name, registry.REGISTRY)}; "
              f"`flower-pfl strategies` lists them", file=sys.stderr)
        return 2
    entry = registry.REGISTRY[name]

    def wrap(text: str, indent: str) -> str:
        return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent)

    print(wrap(f"{entry.name}: {entry.summary}", ""))

    def bound(load: Callable[[str], type]) -> str:
        try:
            cls = load(name)
        except LookupError:  # nothing bound to the entry
            return "(none bound)"
        return f"{cls.__module__}.{cls.__qualname__}"

    # the client index imports torch (its clients train): a second or two
    print(f"  strategy {bound(registry.strategy_class)}, client {bound(registry.client_class)}")
    if not entry.hyper:
        print("  no hyper-parameters")
        return 0
    print(f"  hyper-parameters (YAML: hyper: {{{name}: {{KEY: VALUE}}}}, or "
          f"--set hyper.{name}.KEY=VALUE):")
    for key, h in entry.hyper.items():
        print(wrap(f"{key} = {h.default!r}" + (f"  ({h.allowed})" if h.allowed else ""), "    "))
        if h.doc:
            print(wrap(h.doc, "        "))
    return 0


def compare_command(args: argparse.Namespace) -> int:
    """``flower-pfl compare RUN_DIR ...`` (reporting/compare.py): 0 written, 2 refused."""
    from flower_pfl.reporting.compare import CompareError, compare

    out = Path(args.out or Path("outputs") / time.strftime("compare-%Y%m%d-%H%M%S"))
    try:
        result = compare(args.runs, out, args.metric, args.allow_unfinished)
    except CompareError as exc:
        print(f"flower-pfl compare: {exc}", file=sys.stderr)
        return 2
    print(result.table)
    print(f"written to {out.resolve()}/: " + ", ".join(p.name for p in result.files))
    return 0


def deploy_command(args: argparse.Namespace, cfg: config_mod.RunConfig) -> int:
    from flower_pfl.running.deploy import deploy

    if not args.certs and not args.insecure:
        print("flower-pfl: deploy needs --certs DIR (TLS + node auth) or --insecure",
              file=sys.stderr)
        return 2
    if args.data_root and cfg["data.dataset"] == "site":  # node i reads its own path
        print("flower-pfl: cannot start: --data-root with data.dataset: site: set data.root "
              "in the YAML instead (node i reads <data.root>/<i>/ or <data.root>/<i>.csv)",
              file=sys.stderr)
        return 2
    try:  # SuperNodes on this machine: its device, folders and the data sizes, before any start
        results_dir = new_results_dir(cfg)
        check_before_start(cfg, "deployment", results_dir)
    except (PreflightError, FileExistsError) as exc:
        print(f"flower-pfl: cannot start: {exc}", file=sys.stderr)
        return 2
    stop_on_signals()
    try:
        deploy(Path(args.config), args.set or [], results_dir, cfg["clients"],
               None if args.insecure else Path(args.certs),
               [g for g in args.gpus.split(",") if g], args.data_root, args.timeout)
    except LaunchError as exc:
        mark_failed(results_dir, exc)  # where the ServerApp could not say so itself
        print("\n".join(summary_lines(results_dir)) + f"\nflower-pfl: FAILED: {exc}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        stop.mark_stopped(results_dir)
        print("flower-pfl: stopped; every process of the deployment stopped", file=sys.stderr)
        return 128 + getattr(exc, "signum", signal.SIGINT)
    print("\n".join(summary_lines(results_dir)))  # status, coverage, final numbers
    return 0


def actor_estimate(cfg: config_mod.RunConfig) -> int | None:
    """How many clients Ray runs at a time on this machine (CPU-bound; None with GPUs)."""
    if float(cfg["client-resources.num-gpus"]) > 0:
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(int(cfg["clients"]), (cpus or 1) // int(cfg["client-resources.num-cpus"])))


def run_command(args: argparse.Namespace, cfg: config_mod.RunConfig, config_path: Path,
                sets: Sequence[str], resume_dir: Path | None) -> int:
    """``flower-pfl run``: preflight, the federation with its console, the summary."""
    try:
        results_dir = resume_dir or new_results_dir(cfg)
    except FileExistsError as exc:
        print(f"flower-pfl: cannot start: {exc}", file=sys.stderr)
        return 2
    # an existing Ray cluster: --ray-address, else RAY_ADDRESS (flower_pfl.raynode)
    ray_address = getattr(args, "ray_address", None) or raynode.joined_cluster()
    console = RunConsole(cfg["rounds"], clients=cfg["clients"],
                         actors=None if ray_address else actor_estimate(cfg),
                         verbose=args.verbose, quiet=args.quiet)
    initial = results_dir / initial_model.FILE  # read by the ServerApp, removed at the end
    try:
        if ray_address:
            check_ray_address(ray_address)
        tracking.require(cfg.values)
        with console.own_warnings():  # a child: this process never imports torch; the child
            preflight_apart(cfg, results_dir, initial_out=initial,  # writes the initial model
                            scope="cluster" if ray_address else "simulation")
    except Exception as exc:  # noqa: BLE001 - PreflightError, DataError, TrackingError
        print(f"flower-pfl: cannot start: {exc}", file=sys.stderr)
        return 2
    split = ("own data per site" if cfg["data.dataset"] == "site"
             else f"{cfg['data.partition']} partition")
    console.print(f"flower-pfl: {cfg.strategy} on {cfg['data.dataset']} ({split})"
                  f", {cfg['clients']} clients, {cfg['rounds']} rounds -> {results_dir}"
                  f"{' (resumed)' if resume_dir else ''} (full log: flwr-run.log there)")
    if ray_address:
        source = "--ray-address" if getattr(args, "ray_address", None) else "RAY_ADDRESS"
        console.print(f"flower-pfl: the clients run on the Ray cluster at {ray_address} "
                      f"({source}); the nodes, CPUs and GPUs the simulation sees there "
                      f"follow its first round; each fit's node is in fit.csv (ray_node)")
    def ask_to_stop(signum: int) -> None:
        stop.request_stop(results_dir)
        print(f"\nflower-pfl: {signal.Signals(signum).name}: stopping after the round in "
              f"progress (it is checkpointed); send it again to stop now", file=sys.stderr)

    stops = StopAfterRound(ask_to_stop)
    stops.install()
    try:
        with console:
            run_simulation(cfg, config_path, list(sets), results_dir, timeout_s=args.timeout,
                           echo=False, resume=resume_dir is not None, on_line=console.feed,
                           ray_address=ray_address, initial_arrays=initial)
    except LaunchError as exc:  # summary.json: the ServerApp's error, else the launcher's
        mark_failed(results_dir, exc)
        console.summary(results_dir, console.elapsed())
        print(f"flower-pfl: FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # a second signal (procs.Terminated): stopped at once
        name = exc.args[0] if isinstance(exc, Terminated) else "interrupted"
        stop.mark_stopped(results_dir)
        print(f"flower-pfl: {name}; every process of the run stopped. "
              f"{resume_hint(results_dir)}", file=sys.stderr)
        return 128 + getattr(exc, "signum", signal.SIGINT)
    except Exception as exc:  # the launcher's own failure: recorded too, then raised
        mark_failed(results_dir, exc)
        raise
    finally:
        stop.clear_stop(results_dir)
        initial.unlink(missing_ok=True)
    summary = read_summary(results_dir) or {}
    console.summary(results_dir, console.elapsed(),
                    tracking.logdir_hint(cfg.values, results_dir)
                    if tracking.enabled(cfg.values) else None)
    if summary.get("status") == "stopped":
        print(f"flower-pfl: {signal.Signals(stops.signum or signal.SIGINT).name}: the run "
              f"stopped after round {len(summary.get('rounds') or [])} of {cfg['rounds']}. "
              f"{resume_hint(results_dir)}", file=sys.stderr)
        return 128 + int(stops.signum or signal.SIGINT)
    return 0


def resume_hint(results_dir: Path) -> str:
    """How to continue a stopped run -- only where a checkpoint exists to continue from."""
    folder = checkpoints.latest_checkpoint(results_dir)
    if folder is None:
        return "It wrote no checkpoint, so it cannot be resumed (checkpoint-every 0?)."
    return (f"Its checkpoint is after round {int(folder.name.split('-')[-1])}; continue with "
            f"`flower-pfl run --resume {results_dir}`")


def bench_main(argv: Sequence[str] | None = None) -> int:
    """``flower-pfl bench MATRIX.yaml ...`` (running/bench.py, matrix.py)."""
    p = argparse.ArgumentParser(prog="flower-pfl bench",
                                description="strategies x settings x seeds, each cell a real "
                                "run; the whole matrix is validated before any cell runs; "
                                "resumes where it stopped. Format: docs/bench.md")
    p.add_argument("matrix", help="the matrix YAML file (docs/bench.md; benchmarks/*.yaml)")
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
    p.add_argument("--echo", "--verbose", dest="echo", action="store_true",
                   help="show Flower's and Ray's own log of every run, unfiltered")
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
    console = BenchConsole(len(matrix.cells(out)), verbose=args.echo)
    try:
        with console:
            records = run_bench(matrix, out, args.superlink, False, args.timeout, only,
                                log=console.log, ray=args.ray, retries=args.retries,
                                progress=console)
    except PreflightError as exc:  # bench.check_cells: before any cell, folder or process
        print(f"flower-pfl bench: cannot start: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("flower-pfl bench: interrupted; processes stopped (rerun to resume)",
              file=sys.stderr)
        return 130
    return 1 if any(r["status"] == "failed" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
