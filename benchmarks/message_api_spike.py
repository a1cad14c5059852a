"""Message-API spike: per-round cost of the legacy path and the Message API side by side.

Runs each strategy on the same small configuration twice in this process -- the legacy
path (:func:`flower_pfl.running.inprocess.run`: ``flwr.server.strategy.Strategy``, legacy
``FitIns``/``FitRes`` turned into Messages as Flower's ``GridClientProxy`` does) and the
Message API (:func:`flower_pfl.message_api.inprocess.run`:
``flwr.serverapp.strategy.Strategy.start()`` on an in-process ``Grid``, ``ArrayRecord`` +
``ConfigRecord``) -- both moving every message through Flower's object-store
serialisation, then compares ``clients.csv`` / ``rounds.csv`` value by value
(benchmarks/same_metrics.py's ``compare``) and prints per round: the wall-clock seconds of
the round (end of round r-1 to end of round r; round 1 from the call), the server's own
seconds (server.csv: ``server_prepare_s`` + ``server_aggregate_s``, both paths log them
the same way) and the bytes on the wire (every message and reply deflated as Flower's
object store does; counted in a separate, untimed run).  The order of the two paths
alternates with ``--repeat``; the table shows the median over repeats.

    .venv/bin/python benchmarks/message_api_spike.py                    # fedavg fedamp
    .venv/bin/python benchmarks/message_api_spike.py fedamp --rounds 8 --set model=cnn
    .venv/bin/python benchmarks/message_api_spike.py --all   # every strategy, numbers only

Docs: docs/design.md, "Message API spike".
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects  # noqa: E402

from benchmarks.same_metrics import compare, with_changes  # noqa: E402
from flower_pfl import config, registry  # noqa: E402
from flower_pfl.message_api import inprocess as mapi  # noqa: E402
from flower_pfl.message_api import server_app  # noqa: E402
from flower_pfl.reporting.run_files import read_rows  # noqa: E402
from flower_pfl.running import inprocess as legacy  # noqa: E402

CONFIG = {"rounds": 5, "clients": 10, "fraction-fit": 0.5, "model": "dnn", "seed": 0,
          "eval-every": 1, "checkpoint-every": 0,
          "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 3000},
          "train": {"epochs": 1, "batch-size": 32, "lr": 0.05}}
PATHS = ("legacy", "message")


class Clock:
    """End-of-round timestamps and wire bytes so far, by round (0: the run's start)."""

    def __init__(self, counter: list[int]) -> None:
        self.at: dict[int, float] = {0: time.perf_counter()}
        self.sent: dict[int, int] = {0: 0}
        self.counter = counter

    def __call__(self, strategy: Any, server_round: int) -> None:
        if server_round:  # the Message API's call with round 0 keeps the run's start
            self.at[server_round] = time.perf_counter()
            self.sent[server_round] = self.counter[0]

    @staticmethod
    def steps(stamps: dict[int, Any]) -> list[Any]:
        """Round r's share: stamps[r] - stamps[r - 1]."""
        return [stamps[r] - stamps[r - 1] for r in sorted(stamps) if r]


def run_path(path: str, cfg: config.RunConfig, out: Path, counter: list[int]) -> Clock:
    """One run of ``cfg`` on ``path`` (legacy / message), its clock."""
    clock = Clock(counter)
    if path == "legacy":
        legacy.run(cfg, out, on_round=clock)
    else:
        mapi.run(cfg, out, on_round=clock)
    return clock


def count_bytes(path: str, cfg: config.RunConfig, out: Path) -> list[int]:
    """Bytes on the wire per round: every message and reply deflated as Flower's object
    store does (``over_the_wire``, patched in both runners for this run only)."""
    counter = [0]
    original = legacy.over_the_wire

    def wire(message: Any) -> Any:
        counter[0] += sum(len(o.deflate()) for o in get_all_nested_objects(message).values())
        return original(message)

    legacy.over_the_wire = mapi.over_the_wire = wire  # type: ignore[assignment]
    try:
        clock = run_path(path, cfg, out, counter)
    finally:
        legacy.over_the_wire = mapi.over_the_wire = original  # type: ignore[assignment]
    return Clock.steps(clock.sent)


def server_seconds(results: Path) -> list[float]:
    """server.csv: the server's prepare + aggregate seconds of each round."""
    return [float(r.get("server_prepare_s") or 0) + float(r.get("server_aggregate_s") or 0)
            for r in read_rows(results, "server")]


def bench(name: str, tree: dict[str, Any], repeat: int, tmp: Path) -> bool:
    """Print ``name``'s side-by-side table; True when the per-client numbers agree."""
    cfg = config.validate({**tree, "strategy": name}, source="message_api_spike")
    walls: dict[str, list[list[float]]] = {p: [] for p in PATHS}
    server: dict[str, list[list[float]]] = {p: [] for p in PATHS}
    for k in range(repeat):
        for path in (PATHS if k % 2 == 0 else PATHS[::-1]):
            out = tmp / f"{name}-{path}-{k}"
            walls[path].append(Clock.steps(run_path(path, cfg, out, [0]).at))
            server[path].append(server_seconds(out))
    total, diff, max_abs, _, notes = compare(tmp / f"{name}-legacy-0", tmp / f"{name}-message-0")
    sent = {p: count_bytes(p, cfg, tmp / f"{name}-{p}-bytes") for p in PATHS}
    print(f"\n## {name}: {cfg['clients']} clients, {cfg['fraction-fit']} sampled, "
          f"{cfg['rounds']} rounds, {cfg['model']}; median of {repeat}")
    print(f"per-client numbers (clients.csv + rounds.csv): {total} values, {diff} differ"
          + (f" (max |diff| {max_abs:.3g}); {'; '.join(notes)}" if diff or notes else ""))
    print("| round | legacy round s | Message API round s | ratio | legacy server s | "
          "Message API server s | legacy kB | Message API kB |")
    print("|---|---|---|---|---|---|---|---|")
    med = {p: [statistics.median(v) for v in zip(*walls[p])] for p in PATHS}
    srv = {p: [statistics.median(v) for v in zip(*server[p])] for p in PATHS}
    for r in range(len(med["legacy"])):
        a, b = med["legacy"][r], med["message"][r]
        print(f"| {r + 1}{' (setup)' if r == 0 else ''} | {a:.3f} | {b:.3f} | {b / a:.2f} | "
              f"{srv['legacy'][r]:.4f} | {srv['message'][r]:.4f} | "
              f"{sent['legacy'][r] / 1e3:.1f} | {sent['message'][r] / 1e3:.1f} |")
    later = {p: sum(med[p][1:]) / max(1, len(med[p]) - 1) for p in PATHS}
    print(f"| mean of rounds 2.. | {later['legacy']:.3f} | {later['message']:.3f} | "
          f"{later['message'] / later['legacy']:.2f} | | | | |")
    return diff == 0 and not notes


#: --all: every registered strategy, numbers only, on a smaller configuration
ALL = {**CONFIG, "rounds": 2, "clients": 4, "data": {**CONFIG["data"], "subsample": 800}}


def same_for_all(tree: dict[str, Any], tmp: Path) -> bool:
    """Every registered strategy through :class:`PaperStrategy` as it is (a subclass per
    name, made here: the spike ports only FedAvg and FedAMP); one line each."""
    ok = True
    for name in sorted(registry.bindings()):
        server_app.STRATEGIES.setdefault(
            name, type(f"Message_{name}", (server_app.PaperStrategy,), {"papers": (name,)}))
        cfg = config.validate({**tree, "strategy": name}, source="message_api_spike")
        legacy.run(cfg, tmp / f"all-{name}-legacy")
        try:
            mapi.run(cfg, tmp / f"all-{name}-message")
        except Exception as exc:  # noqa: BLE001 - reported, the others go on
            print(f"{name}: the Message API run failed: {type(exc).__name__}: {exc}")
            ok = False
            continue
        total, diff, max_abs, _, notes = compare(tmp / f"all-{name}-legacy",
                                                 tmp / f"all-{name}-message")
        print(f"{name}: {total} values, {'identical' if not diff and not notes else diff}"
              + (f" differ (max |diff| {max_abs:.3g}) {notes}" if diff or notes else ""))
        ok = ok and not diff and not notes
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("strategies", nargs="*", default=["fedavg", "fedamp"])
    p.add_argument("--rounds", type=int, default=CONFIG["rounds"])
    p.add_argument("--repeat", type=int, default=3, help="runs of each path (default 3)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--all", action="store_true", help="instead: every registered strategy "
                   "through the spike's PaperStrategy, same numbers or not (no timing)")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    tree = with_changes({**CONFIG, "rounds": args.rounds}, args.set)
    if args.all:
        with tempfile.TemporaryDirectory(prefix="message-api-spike-") as tmp:
            return 0 if same_for_all(with_changes(ALL, args.set), Path(tmp)) else 1
    with tempfile.TemporaryDirectory(prefix="message-api-spike-") as tmp:
        same = [bench(name, tree, args.repeat, Path(tmp)) for name in args.strategies]
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
