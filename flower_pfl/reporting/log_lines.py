"""Reading the lines of ``flwr run --stream``: what each one is, and our round line's numbers.

The output of a federation (the ServerApp's Flower log, ANSI coloured; Ray's and Python's
warnings; Flower's notices) is sorted line by line by :func:`classify` into the kinds the
consoles (:mod:`flower_pfl.reporting.console`) act on: the strategy's per-round line
(``[flower-pfl] round N: ...``, read by :func:`parse_round`, written short by
:func:`format_round`), Flower's ``[ROUND n]``, the run's start, our other lines,
WARNING/ERROR lines, known warnings translated into one short note
(:func:`translate_warning`), unrecognised lines (a traceback: shown) and hidden ones.
Hidden: Flower's INFO chatter and end-of-run History dump, "Flower configuration not found",
the "default simulated SuperNodes changed from 10 to 2" warning (not our count: ``flower-pfl
run`` sets ``num-supernodes``), Ray's accelerator FutureWarning, "Manually terminating
ClientAppActor"; every line stays in ``flwr-run.log`` whatever its kind.

Choices: accuracies in percent (the tables' unit), the synthetic task's squared error as it
is; durations as ``1h02m03s`` / ``2m03s`` / ``3s``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LOG_LINE = re.compile(r"^(?P<actor>\([^)]*pid=\d+[^)]*\)\s*)?"
                      r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*:\s?(?P<text>.*)$")
ROUND_LINE = re.compile(r"\[flower-pfl\] round (?P<round>\d+): personalized (?P<metric>\w+) "
                        r"mean (?P<mean>\S+) weighted (?P<weighted>\S+) std \S+ "
                        r"worst10% (?P<worst10>\S+) top10% (?P<top10>\S+) min \S+ "
                        r"\| best mean (?P<best>\S+)"
                        r"(?: \| global \w+ mean (?P<global_>\S+))?"
                        r" \| (?P<answered>\d+) clients answered, (?P<missing>\d+) did not"
                        r"(?: \| devices (?P<devices>.*))?")
# our own INFO lines the console replaces (round lines, the summary); a checkpoint line
# stays (where a stopped run resumes from)
OURS_HIDDEN = re.compile(r"\[flower-pfl\] (strategy=|final per-round table|per-client table|"
                         r"simulation engine:|initial model:)")
# lines that are never worth a researcher's attention (all of them stay in flwr-run.log)
NOISE = re.compile(
    r"Flower configuration not found|Using SuperLink:|Successfully installed |"
    r"default simulated SuperNodes changed|Manually terminating ClientAppActor|"
    r"FutureWarning: Tip: In future versions of Ray|RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO|"
    r"^\s*warnings\.warn\($")
CLASSES_UNUSED = re.compile(r"Classes: (\[[^\]]*\]) will NOT be used")
STARTED = re.compile(r"Successfully started run (\d+)")
ROUND_START = re.compile(r"\[ROUND (\d+)\]")
# Ray's line for a ClientApp actor's process that died (the actor queue's own 'actor died' line
# says what became of its messages; Ray's full message stays in flwr-run.log)
RAY_WORKER_DIED = re.compile(r"\(raylet\) A worker died or was killed .*Worker PID: (\d+)")


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def translate_warning(text: str) -> str | None:
    """A known warning as one short line of ours (None: not a known one)."""
    m = CLASSES_UNUSED.search(text)
    if m:
        return (f"note: the pathological partition gives classes {m.group(1)} to no client "
                f"(clients x classes-per-client does not cover every class)")
    m = RAY_WORKER_DIED.search(text)
    if m:
        return (f"note: Ray: worker process {m.group(1)} died (Ray's message: flwr-run.log; "
                f"its messages: the 'actor died' line)")
    return None


def classify(line: str) -> tuple[str, str]:
    """(kind, text) of one raw output line; kind is one of ``round`` (our per-round line),
    ``round-start`` (Flower's ``[ROUND n]``), ``started`` (the run was submitted),
    ``ours`` (another ``[flower-pfl]`` line), ``warning`` (WARNING/ERROR/CRITICAL),
    ``note`` (a known warning, translated), ``other`` (unrecognised: shown) or ``hidden``;
    text is the line without ANSI codes and Flower's level prefix."""
    plain = strip_ansi(line).rstrip("\n").rstrip()
    m = LOG_LINE.match(plain)
    if m is None:
        if not plain.strip():
            return "hidden", ""
        note = translate_warning(plain)
        if note:
            return "note", note
        started = STARTED.search(plain)
        if started:
            return "started", started.group(1)
        if NOISE.search(plain):
            return "hidden", plain
        return "other", plain
    level, text = m.group("level"), m.group("text").strip()
    if level in ("WARNING", "ERROR", "CRITICAL"):
        if NOISE.search(text):
            return "hidden", text
        return "warning", f"{level}: {text}"
    if level == "DEBUG":
        return "hidden", text
    if ROUND_LINE.search(text):
        return "round", text
    if ROUND_START.fullmatch(text):
        return "round-start", text
    if text.startswith("[flower-pfl]") and not OURS_HIDDEN.search(text):
        return "ours", text
    return "hidden", text


@dataclass
class RoundInfo:
    round: int
    metric: str
    mean: float
    worst10: float
    top10: float
    best: float
    global_: float | None
    answered: int
    missing: int
    devices: str


def parse_round(text: str) -> RoundInfo | None:
    """The numbers of the strategy's ``[flower-pfl] round N: ...`` line (None: not one)."""
    m = ROUND_LINE.search(strip_ansi(text))
    if m is None:
        return None
    g = m.groupdict()
    return RoundInfo(int(g["round"]), g["metric"], float(g["mean"]), float(g["worst10"]),
                     float(g["top10"]), float(g["best"]),
                     None if g["global_"] is None else float(g["global_"]),
                     int(g["answered"]), int(g["missing"]), (g["devices"] or "").strip())


def fmt_s(seconds: float | None) -> str:
    """``1h02m03s`` / ``2m03s`` / ``3s``; ``unknown`` for None or not finite."""
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def fmt_metric(value: float | None, metric: str) -> str:
    """Accuracy in percent, an error (mse) as it is."""
    if value is None or not math.isfinite(value):
        return "–"
    return f"{100 * value:.2f}%" if metric == "accuracy" else f"{value:.4f}"


def format_round(r: RoundInfo, total: int, timing: str = "", devices: bool = False) -> str:
    """One console line for an evaluated round."""
    def f(v: float | None) -> str:
        return fmt_metric(v, r.metric)

    what = "" if r.metric == "accuracy" else f" {r.metric}"  # accuracy: the % says it
    line = (f"round {r.round:>{len(str(total))}}/{total}  personalized{what} {f(r.mean)}  "
            f"worst-10% {f(r.worst10)}  top-10% {f(r.top10)}  best {f(r.best)}")
    if r.global_ is not None:
        line += f" | global {f(r.global_)}"
    if r.missing:
        line += f" | {r.missing} client(s) did not answer"
    if devices and r.devices:
        line += f" | devices {r.devices}"
    return line + (f" | {timing}" if timing else "")
