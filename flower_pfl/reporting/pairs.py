"""A bench's paired comparisons: for each ``pairs:`` entry [A, B] and setting, A − B per seed,
its mean, the 95% Student-t interval and the verdict (:mod:`flower_pfl.reporting.stats`), as
``pairs.csv`` rows and table.md's "Paired comparisons" section; and the one-model mark (a
strategy whose personalized numbers are its global model's).  Used by
:mod:`flower_pfl.reporting.tables`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from flower_pfl.matrix import Matrix
from flower_pfl.reporting.stats import paired_interval, verdict

# What a pair compares, like with like: (column, its name, which model)
PAIRED = (("final_mean", "final mean", "personalized"),
          ("final_worst10", "worst-10%", "personalized"),
          ("final_worst5", "worst-5%", "personalized"),
          ("global_final", "final mean", "global"),
          ("global_worst5", "worst-5%", "global"))
PAIR_FIELDS = ("setting", "a", "b", "column", "model", "n", "seeds", "diffs", "mean", "half",
               "low", "high", "verdict")


def pair_records(matrix: Matrix, records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per setting, pair (A, B) and compared column: A - B on each seed where both finished,
    its mean, the 95% Student-t interval and the verdict (:mod:`flower_pfl.reporting.stats`).  The
    global column only where both strategies have a global model."""
    by_key = {(r["setting"], r["strategy"]): r for r in records}
    rows = []
    for setting in matrix.settings:
        for a, b in matrix.pairs:
            if (setting, a) not in by_key or (setting, b) not in by_key:
                continue  # the setting does not run both
            ra, rb = by_key[(setting, a)], by_key[(setting, b)]
            sa, sb = ra.get("per_seed") or {}, rb.get("per_seed") or {}
            lower = bool(ra.get("lower_is_better") or rb.get("lower_is_better"))
            for col, name, model in PAIRED:
                seeds = sorted(s for s in set(sa) & set(sb) if col in sa[s] and col in sb[s])
                if model == "global" and not seeds:
                    continue  # one of them has no global model (or none finished)
                row: dict[str, Any] = {"setting": setting, "a": a, "b": b, "column": name,
                                       "model": model, "lower_is_better": lower,
                                       "n": len(seeds),
                                       "seeds": " ".join(map(str, seeds))}
                if not seeds:
                    row["verdict"] = "n/a (no seed where both finished)"
                else:
                    iv = paired_interval([sa[s][col] for s in seeds], [sb[s][col] for s in seeds])
                    row.update(mean=iv.mean, half=iv.half, low=iv.low, high=iv.high,
                               per_seed=iv.diffs, diffs=" ".join(f"{d:.10g}" for d in iv.diffs),
                               verdict=verdict(iv, lower_is_better=lower))
                rows.append(row)
    return rows


GLOBAL_MARK = " †"


def one_model(rec: Mapping[str, Any]) -> bool:
    """Whether a record's strategy trains one model only (FedAvg, FedSAM, ...): on every
    finished seed its personalized final numbers are its global model's."""
    per_seed = rec.get("per_seed") or {}
    return bool(per_seed) and all(
        "global_final" in v and v["global_final"] == v["final_mean"]
        for v in per_seed.values())


def global_note(records: Sequence[Mapping[str, Any]]) -> str:
    """The sentence explaining the one-model mark, where a table has such a row."""
    if not any(one_model(r) for r in records):
        return ""
    return (f" A strategy marked{GLOBAL_MARK} trains one model: its personalized columns "
            f"hold its global model.")


def metric_words(records: Sequence[Mapping[str, Any]]) -> str:
    """What the table's numbers are: accuracy in %, or an error (lower is better)."""
    if any(r.get("lower_is_better") for r in records):
        return "Personalized mean squared error (lower is better; not in %)"
    return "Personalized accuracy in %"


def pairs_md(matrix: Matrix, rows: Sequence[Mapping[str, Any]],
             marked: Sequence[tuple[str, str]] = ()) -> list[str]:
    """table.md's "Paired comparisons"; ``marked``: (setting, strategy) keys of one-model
    strategies, marked as in the table."""
    def name(setting: str, strategy: str) -> str:
        return strategy + (GLOBAL_MARK if (setting, strategy) in marked else "")

    lines = ["## Paired comparisons", "",
             "A − B on the same seed (only seeds where both finished), per seed and its mean, "
             "with the 95% Student-t interval (t quantile for n − 1 degrees of freedom; no "
             "interval with one seed). Personalized is compared with personalized, global with "
             f"global (for a strategy marked{GLOBAL_MARK}, its personalized is its global model). "
             "Verdict: **holds** = the interval excludes 0 on A's better side, **does "
             "not hold** = it excludes 0 on B's better side, **not resolved at n seeds (±h)** "
             "= it contains 0, h being its half-width: at this spread a mean difference must "
             "exceed h to be told from 0 at n seeds (for an error metric, marked so, lower is "
             "better).", ""]
    for setting in matrix.settings:
        mine = [r for r in rows if r["setting"] == setting]
        if not mine:
            continue
        lines += [f"### {setting}", "",
                  "| A − B | compared | seeds | per seed | mean | 95% interval | verdict |",
                  "|---|---|---|---|---|---|---|"]
        for r in mine:
            if r["n"] == 0:
                nums = ["–", "–", "–"]
            else:
                per = ", ".join(f"{d:+.2f}" for d in r["per_seed"])
                ci = "– (1 seed)" if r["half"] is None else \
                    f"[{r['low']:+.2f}, {r['high']:+.2f}]"
                nums = [per, f"{r['mean']:+.2f}", ci]
            kind = r["model"] + (", error: lower is better" if r["lower_is_better"] else "")
            lines.append(f"| {name(setting, r['a'])} − {name(setting, r['b'])} | "
                         f"{r['column']} ({kind}) | "
                         f"{r['seeds'].replace(' ', ',') or '–'} | " + " | ".join(nums)
                         + f" | {r['verdict']} |")
        lines.append("")
    return lines
