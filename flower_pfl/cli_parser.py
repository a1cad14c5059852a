"""The argument parser of the ``flower-pfl`` command line: every command's options and help
(:func:`build_parser`).  What the commands do: :mod:`flower_pfl.cli` (its module docstring
lists them); ``superlink``, ``supernode`` and ``submit`` parse their own arguments
(:mod:`flower_pfl.running.sites`), ``bench`` too (:func:`flower_pfl.cli.bench_main`).
"""

from __future__ import annotations

import argparse

from flower_pfl.config import APP_DIR


def build_parser(description: str) -> argparse.ArgumentParser:
    """The parser of ``flower-pfl`` and its commands (``description``: the first line of
    :mod:`flower_pfl.cli`'s docstring)."""
    parser = argparse.ArgumentParser(prog="flower-pfl", description=description)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("bench", help="run a matrix of strategies x settings x seeds, then its "
                   "table and plots (flower-pfl bench --help; format: docs/bench.md)")
    helps = {"run": "run one configuration in Flower's Ray simulation; results in "
                    "<output-dir>/<run-name>/",
             "validate": "check a configuration (every problem at once) without running it"}
    for name in ("run", "validate"):
        p = sub.add_parser(name, help=helps[name], description=helps[name])
        p.add_argument("--config", default=str(APP_DIR / "simulation.yaml"),
                       help="the run's YAML file (default: the app's simulation.yaml)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override one key for this run (repeatable), e.g. --set rounds=5")
        p.add_argument("--engine", choices=("tuned", "stock"), default=None, help="tuned: our "
                       "replacements of Flower's engine code; stock: Flower as released "
                       "(docs/engine.md); the same as --set engine=...")
        if name == "run":
            p.add_argument("--timeout", type=float, default=None, help="seconds before giving up")
            loud = p.add_mutually_exclusive_group()
            loud.add_argument("--verbose", action="store_true",
                              help="show Flower's and Ray's own log, unfiltered (it is always "
                              "in <results>/flwr-run.log)")
            loud.add_argument("--quiet", action="store_true",
                              help="no per-round lines and no progress bar: warnings and the "
                              "closing summary only")
            p.add_argument("--tensorboard", metavar="DIR", default=None,
                           help="write TensorBoard events to DIR/<run name> (the YAML's "
                           "'tracking: tensorboard' writes them to <results>/tensorboard); "
                           "needs pip install 'flower-pfl[tensorboard]'")
            p.add_argument("--ray-address", metavar="HOST:PORT", default=None,
                           help="run the clients on an existing Ray cluster: the address of "
                           "its head (`ray start --head --port=PORT` there; what every node "
                           "needs: docs/deployment.md). Default: RAY_ADDRESS from the "
                           "environment, else a private Ray instance on this machine")
            p.add_argument("--resume", metavar="RESULTS_DIR", default=None,
                           help="continue a stopped run from its newest checkpoint with its "
                           "own configuration; --set rounds=N extends a finished one (only "
                           "rounds, output, tracking and time-limit keys may differ)")
    p = sub.add_parser("strategies", help="list the registered strategies; with NAME, one "
                       "strategy's description and hyper-parameters")
    p.add_argument("name", nargs="?", help="a registered strategy, e.g. fedamp")
    text = ("the bench's table and overlaid curves of finished runs (each RUN_DIR as "
            "`flower-pfl run` wrote it)")
    p = sub.add_parser("compare", help=text, description=text + "; writes table.md, "
                       "table.csv, curves.png, clients.png to --out")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a run's results folder")
    p.add_argument("--metric", action="append", metavar="KEY",
                   help="a rounds.csv statistic to draw (repeatable), e.g. personal_top10_mean, "
                   "personal_std, personal_trained_mean, global_worst10_mean; a table column "
                   "where the bench's table has none (default: personal_mean, "
                   "personal_worst10_mean and global_mean where a run has one)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="output folder (default: outputs/compare-<time> in the cwd)")
    p.add_argument("--allow-unfinished", action="store_true",
                   help="also compare stopped or failed runs (and runs with failed clients) "
                   "at their last evaluated round, marked in the table")
    text = ("write each client's data shard to DIR/<partition-id>/ (data per site in "
            "deployment): client machine i gets DIR/<i> as `flower-pfl supernode --data`; on "
            "one machine `flower-pfl deploy --data-root DIR`")
    p = sub.add_parser("partition", help=text, description=text)
    p.add_argument("--config", default=str(APP_DIR / "simulation.yaml"),
                   help="the run's YAML file (default: the app's simulation.yaml)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one key (repeatable), as for run")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the shards")
    text = ("make a throwaway CA + server certificate (testing): DIR/ca.crt, server.pem, "
            "server.key")
    p = sub.add_parser("certs", help=text, description=text)
    p.add_argument("dir", metavar="DIR", help="folder for the files")
    p.add_argument("--host", action="append", metavar="NAME",
                   help="a host name or IP address the SuperNodes use to reach the SuperLink "
                   "(repeatable); the certificate names these AND always 127.0.0.1, "
                   "localhost and ::1 (the SuperLink's own ServerApp connects over loopback)")
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
    for name, text in (("superlink", "the server machine's SuperLink of a deployment on "
                        "separate machines (flower-pfl superlink --help)"),
                       ("supernode", "one client machine's SuperNode of such a deployment "
                        "(flower-pfl supernode --help)"),
                       ("submit", "submit a run to such a deployment's SuperLink "
                        "(flower-pfl submit --help)")):
        sub.add_parser(name, help=text)
    return parser
