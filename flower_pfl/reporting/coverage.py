"""How many clients a run's numbers cover: each round, the final metrics, the fits.

A round goes on without a client whose message failed (a node gone, a client that raised,
an upload refused; docs/reliability.md "Client failures"), so a run can end ``completed``
with numbers over fewer clients than configured.  That is recorded, not hidden, and read
the same way everywhere (docs/reliability.md "Coverage"):

* ``rounds.csv``: ``clients_evaluated`` (how many clients the round's statistics are over),
  ``fit_accepted`` / ``fit_sampled`` (that round's fit); ``server.csv`` has every round's fit;
* ``summary.json`` ``coverage``: :func:`coverage_record` of those rows;
* the console's closing lines (:func:`coverage_line`), ``flower-pfl compare``'s ``clients``
  column (:func:`coverage_cell`) and the bench's refusal of such a cell
  (:func:`client_failures`) all read that record.

The writer (:class:`~flower_pfl.reporting.results.ResultsWriter`) and the reader of a run on
disk (:func:`run_coverage`, which readers import from here) call
:func:`coverage_record`: one definition, for simulation and deployment alike (both go
through the strategy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from flower_pfl.newcomers import held_out
from flower_pfl.reporting.run_files import read_rows, read_values


def coverage_record(clients: int, evaluated: Mapping[int, int],
                    final_pids: Sequence[int] | None,
                    fits: Sequence[Mapping[str, Any]],
                    held_out: Sequence[int] = ()) -> dict[str, Any]:
    """The run's coverage.

    ``clients``: the configured count; the numbers cover its participants, n = ``clients``
    less the ``held_out`` newcomers (flower_pfl/newcomers.py: evaluated apart, counted
    in neither ``evaluated`` nor ``final_pids``); ``evaluated``: round -> how many clients answered
    that evaluation round; ``final_pids``: the partition-ids of the last evaluated round
    (None: not known); ``fits``: server.csv rows (``sampled``, ``fit_ok``, ``fit_failed``
    per round).  Returns ``clients``, ``final_round`` and ``final_clients_covered`` (k of
    n; absent before the first evaluation), ``final_missing`` (partition-ids, where known),
    ``rounds_short`` (evaluated rounds with fewer than n), the fit totals ``fit_sampled``,
    ``fit_accepted``, ``fit_failed`` (client-rounds) and ``complete`` (no round short, no
    fit failed)."""
    def total(key: str) -> int:
        return sum(int(float(f.get(key) or 0)) for f in fits)

    rounds = sorted(evaluated)
    held = {int(p) for p in held_out}
    everyone = int(clients)
    clients = everyone - len(held)
    record: dict[str, Any] = {"clients": int(clients),
                              "rounds_short": [r for r in rounds if evaluated[r] < clients],
                              "fit_sampled": total("sampled"), "fit_accepted": total("fit_ok"),
                              "fit_failed": total("fit_failed")}
    if rounds:
        record["final_round"] = rounds[-1]
        record["final_clients_covered"] = int(evaluated[rounds[-1]])
        if final_pids is not None:
            record["final_missing"] = sorted(set(range(everyone)) - held
                                             - {int(p) for p in final_pids})
    record["complete"] = not record["rounds_short"] and record["fit_failed"] == 0
    return record


def coverage_cell(record: Mapping[str, Any] | None) -> str:
    """A table cell: ``k/n`` clients in the final metrics, then ``fit A/S`` where fits
    failed (``–`` without a record or an evaluated round)."""
    if not record or "final_clients_covered" not in record:
        return "–"
    cell = f"{record['final_clients_covered']}/{record['clients']}"
    if record.get("fit_failed"):
        cell += f", fit {record['fit_accepted']}/{record['fit_sampled']}"
    return cell


def coverage_line(record: Mapping[str, Any] | None) -> str | None:
    """One sentence on a run whose numbers cover fewer than all clients (None where they
    cover all): the final metrics' k of n and who is missing, the evaluated rounds short of
    n, the fits accepted of those sampled."""
    if not record or record.get("complete", True):
        return None
    n = record["clients"]
    parts = []
    if "final_clients_covered" in record:
        missing = record.get("final_missing")
        parts.append(f"final metrics over {record['final_clients_covered']} of {n} clients"
                     + (f" (partition-id(s) {missing[:20]} missing)" if missing else ""))
    short = record.get("rounds_short") or []
    if short:
        parts.append(f"{len(short)} evaluated round(s) over fewer than all {n} (rounds "
                     f"{_spans(short)}; rounds.csv clients_evaluated)")
    if record.get("fit_failed"):
        parts.append(f"{record['fit_accepted']} of {record['fit_sampled']} sampled client "
                     f"fits accepted ({record['fit_failed']} failed: failures.csv)")
    return "coverage: " + "; ".join(parts)


def _spans(rounds: Sequence[int]) -> str:
    """``[2, 3, 4, 7]`` -> ``2-4, 7``."""
    out: list[str] = []
    start = prev = rounds[0]
    for r in [*rounds[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(f"{start}-{prev}" if prev > start else str(start))
        if r is not None:
            start = prev = r
    return ", ".join(out)


def run_coverage(run_dir: Path) -> dict[str, Any] | None:
    """A run's coverage (:func:`flower_pfl.reporting.coverage.coverage_record`) read from
    its clients.csv and server.csv (or the cell's archive); None without a config.json."""
    if not (Path(run_dir) / "config.json").is_file():
        return None
    per_round: dict[int, list[int]] = {}
    for r in read_rows(run_dir, "clients"):
        if str(r.get("newcomer", "")) not in ("1", "1.0"):  # held out: evaluated apart
            per_round.setdefault(int(r["round"]), []).append(int(r["partition-id"]))
    final = per_round[max(per_round)] if per_round else None
    values = read_values(run_dir)
    return coverage_record(int(values.get("clients", 0)),
                           {k: len(v) for k, v in per_round.items()}, final,
                           read_rows(run_dir, "server"),
                           held_out(values) if values.get("newcomers.clients") else ())


def client_failures(run_dir: Path) -> str | None:
    """Why a completed run's numbers are not its configuration's, or None.

    A run can reach ``completed`` while clients failed (e.g. Ray killed workers for memory,
    a node was lost): the strategy then trains with fewer clients than configured and
    evaluates fewer than all (its coverage, :func:`run_coverage`).  The bench gives such a
    cell no number and reruns it; ``flower-pfl compare`` shows its coverage."""
    cov = run_coverage(run_dir)
    if cov is None or cov["complete"]:
        return None
    return (f"{cov['fit_failed']} failed client fit(s); {len(cov['rounds_short'])} evaluation "
            f"round(s) with fewer than all {cov['clients']} clients")
