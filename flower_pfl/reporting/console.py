"""What ``flower-pfl run`` and ``flower-pfl bench`` print while a federation runs.

Every line of ``flwr run --stream`` (the ServerApp's Flower log, ANSI coloured; Ray's and
Python's warnings; Flower's notices) goes to ``<results>/flwr-run.log`` unchanged
(:func:`flower_pfl.running.procs.stream_run`); :class:`RunConsole` shows a researcher's view:
one line per evaluated round (the strategy's ``[flower-pfl] round N: ...`` line written
short: personalized mean, worst-10%, top-10%, best so far, the global model's mean; elapsed
and ETA without a bar), on a terminal a rich progress bar (round k/N, elapsed, ETA;
:class:`BenchConsole`: cell k/N and the round inside the cell), one line when the
federation starts, every WARNING/ERROR line and every line it does not recognise (a
traceback), known warnings as one short note each (once), and a closing summary from
``summary.json`` (:func:`summary_lines`) whose last lines are the final and best numbers.
``verbose``: every line as written; ``quiet``: no start or round lines.

The parts: :mod:`flower_pfl.reporting.log_lines` sorts and reads the lines (what is hidden,
the round line's numbers, the units); :mod:`flower_pfl.reporting.console_output` prints them
under the bar (colour only on a terminal without ``NO_COLOR``) and follows the rounds (the
ETA); this module is the two consoles and the closing summary.
"""

from __future__ import annotations

import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator

from flower_pfl.reporting.console_output import Output, RoundTracker, follow_round
from flower_pfl.reporting.coverage import coverage_line
from flower_pfl.reporting.log_lines import classify, fmt_metric, fmt_s, format_round
from flower_pfl.reporting.metric_kind import lower_is_better, run_metric
from flower_pfl.reporting.run_files import read_summary
from flower_pfl.warnings_once import first_time, record_every_warning


def summary_lines(results_dir: Path, wall_s: float | None = None,
                  tensorboard: Path | None = None) -> list[str]:
    """The closing summary of a run, from its ``summary.json``: its status (a failed
    run's error), how many clients its numbers cover where that is fewer than all
    (:func:`~flower_pfl.reporting.coverage.coverage_line`); the last lines give the final
    and the best personalized (and global) numbers."""
    results_dir = Path(results_dir)
    summary = read_summary(results_dir) or {}
    rounds = summary.get("rounds") or []
    wall = f" in {fmt_s(wall_s)}" if wall_s is not None else ""
    lines = [f"[flower-pfl] run {summary.get('status', 'ended')}: {len(rounds)} evaluated "
             f"round(s){wall}",
             f"  results: {results_dir}/ (rounds.csv, clients.csv, summary.json, curves.png, "
             f"flwr-run.log)"]
    error = summary.get("error")
    if isinstance(error, dict):
        lines.append(f"  error: {error.get('type')}: {str(error.get('message'))[:1000]}")
    if tensorboard is not None:
        lines.append(f"  TensorBoard: tensorboard --logdir {tensorboard}")
    covered = coverage_line(summary.get("coverage"))
    if covered:
        lines.append(f"  {covered}")
    if not rounds:
        return lines
    metric = run_metric(results_dir)
    pick = min if lower_is_better(metric) else max
    last = rounds[-1]
    for model in ("personal", "global"):
        key = f"{model}_mean"
        if key not in last:
            continue
        best = pick((r for r in rounds if key in r), key=lambda r: r[key])
        name = "personalized" if model == "personal" else "global model"
        worst = fmt_metric(last.get(f"{model}_worst10_mean"), metric)
        lines.append(f"  {name} {metric}: final {fmt_metric(last[key], metric)} (round "
                     f"{last['round']}), best {fmt_metric(best[key], metric)} (round "
                     f"{best['round']}), worst-10% {worst}")
    return lines


class RunConsole:
    """The console of one ``flower-pfl run``: feed it every output line (:meth:`feed`)."""

    def __init__(self, rounds: int, clients: int | None = None, actors: int | None = None,
                 verbose: bool = False, quiet: bool = False, stream: IO[str] | None = None,
                 bar: bool | None = None) -> None:
        self.out = Output(stream, bar=False if (verbose or quiet) else bar)
        self.verbose, self.quiet = verbose, quiet
        self.rounds, self.clients, self.actors = rounds, clients, actors
        self.track = RoundTracker(rounds)
        self.notes: set[str] = set()

    def __enter__(self) -> "RunConsole":
        self.track.started = time.time()  # the one clock: round lines and the summary
        self.out.start([("round", "starting the SuperLink", self.rounds)])
        return self

    def elapsed(self) -> float:
        """Seconds since the run started (what the round lines print; the summary's)."""
        return time.time() - self.track.started

    def __exit__(self, *exc: object) -> None:
        self.out.stop()

    def print(self, text: str, style: str | None = None) -> None:
        self.out.print(text, style)

    def phase(self, text: str) -> None:
        """What is happening now (the bar's label; nothing without a bar)."""
        self.out.update("round", description=text)

    def start_line(self, run_id: str) -> str:
        who = f"{self.clients} clients" if self.clients else "the clients"
        actors = f", {self.actors} at a time" if self.actors else ""
        return (f"[flower-pfl] run {run_id}: starting Ray with {who}{actors}; round 1 is the "
                f"slowest")

    def feed(self, line: str) -> None:
        """One raw line of ``flwr run`` output."""
        if self.verbose:
            self.out.raw(line)
            return
        kind, text = classify(line)
        t = self.track
        n, info, eta = follow_round(self.out, t, kind, text)
        if kind == "started":
            if not self.quiet:
                self.print(self.start_line(text))
            self.phase("starting Ray and the client actors")
        elif n is not None:
            self.phase(f"round {n}/{self.rounds}" + (" (Ray actors starting)"
                                                     if n == t.first else ""))
        elif info is not None:
            show_devices = info.devices != t.devices
            t.devices = info.devices
            timing = "" if self.out.progress is not None else \
                fmt_s(self.elapsed()) + ("" if eta is None else f", ETA {fmt_s(eta)}")
            if not self.quiet:
                self.print(format_round(info, self.rounds, timing, devices=show_devices))
            if info.round >= self.rounds:
                self.phase("stopping the federation (Ray, SuperLink)")
        elif kind == "ours":
            if not self.quiet:
                self.print(text)
        elif kind == "warning":
            self.print(text, style="bold red" if text.startswith(("ERROR", "CRITICAL"))
                       else "yellow")
        elif kind == "note":
            if first_time(self.notes, text):
                self.print(text, style="dim")
        elif kind == "other":
            self.print(text)

    @contextmanager
    def own_warnings(self) -> Iterator[None]:
        """Python warnings raised in this process (e.g. flwr-datasets' while the launcher
        checks the partition) go through the same filter; verbose: left alone."""
        if self.verbose:
            yield
            return
        with warnings.catch_warnings(record=True) as caught:
            record_every_warning()  # not libraries' deprecations
            yield
        for w in caught:
            self.feed(f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}")

    def summary(self, results_dir: Path, wall_s: float | None,
                tensorboard: Path | None = None) -> None:
        self.out.stop()
        for text in summary_lines(results_dir, wall_s, tensorboard):
            self.print(text, style="bold" if text.startswith(("  personalized", "  global"))
                       else "yellow" if text.startswith(("  coverage", "  error")) else None)


class BenchConsole:
    """The console of ``flower-pfl bench``: the bench's own lines (``log``), and on a
    terminal a bar for the cells (k/N) and one for the round inside the current cell;
    ``verbose`` echoes every cell's Flower log as it is."""

    def __init__(self, cells: int, verbose: bool = False, stream: IO[str] | None = None,
                 bar: bool | None = None) -> None:
        self.out = Output(stream, bar=False if verbose else bar)
        self.verbose = verbose
        self.cells = cells
        self.track = RoundTracker(1)
        self.key = ""

    def __enter__(self) -> "BenchConsole":
        self.out.start([("cells", "cells", self.cells), ("round", "", 1)])
        return self

    def __exit__(self, *exc: object) -> None:
        self.out.stop()

    def log(self, text: str, **_: Any) -> None:
        """The bench's ``log`` (``flush=`` accepted as print's)."""
        self.out.print(text, style="yellow" if ": failed" in text or "invalid" in text
                       else None)

    def cell(self, k: int, key: str, rounds: int) -> None:
        """Cell ``k`` (of ``cells``) starts: ``rounds`` rounds."""
        self.key = key
        self.track = RoundTracker(rounds)
        self.out.update("cells", completed=k - 1, description=f"cell {k}/{self.cells}")
        self.out.reset("round", total=rounds, description=f"{key}: starting", eta="")

    def cells_done(self, k: int, eta: float | None) -> None:
        self.out.update("cells", completed=k,
                        eta="" if eta is None else f"ETA {fmt_s(eta)}")

    def feed(self, line: str) -> None:
        """One raw line of the current cell's ``flwr run`` output."""
        if self.verbose:
            self.out.raw(line)
            return
        kind, text = classify(line)
        n, _, _ = follow_round(self.out, self.track, kind, text)
        if n is not None:
            self.out.update("round", description=f"{self.key}: round {n}/{self.track.total}")
        elif kind == "warning" and text.startswith(("ERROR", "CRITICAL")):
            self.out.print(f"[bench]   {self.key}: {text}", style="red")
