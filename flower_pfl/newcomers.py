"""Held-out newcomers: clients that never train, personalized by their method's own rule.

The ``newcomers:`` section of the run configuration (docs/newcomers.md):

* ``newcomers.clients`` -- which clients are held out: a count (an integer >= 1), a
  fraction in (0, 1) of ``clients`` (rounded, at least one) or a list of partition-ids;
  null (the default): none, the run is as it always was;
* ``newcomers.budget-steps`` -- the local adaptation budget, in SGD steps (mini-batches),
  the same for every method; null: the run's own local training (``train.steps``, else
  ``train.epochs`` passes over the newcomer's training data);
* ``newcomers.every`` -- newcomers are evaluated every ``every`` rounds (a multiple of
  ``eval-every``) and always in the last round.

:func:`held_out` draws the held-out partition-ids from the run's seed, with a generator of
its own (salted: the sampling stream of the participants is untouched), before round 1.
The strategy never samples them for training (strategies/nodes.py) and so its aggregation
never reads them; at evaluation each receives a :class:`flower_pfl.instructions.
NewcomerEval` and answers accuracy before and after its rule (clients/base.py
``adapt_newcomer``).  :func:`newcomer_stats` is the round's summary.

Pure data: numpy only, no torch, no Flower.
"""

from __future__ import annotations

import abc
import math
import numbers
from typing import Any, Mapping, Sequence

import numpy as np

from flower_pfl.fields import POS, Field

#: the salt of the held-out draw's generator (``[seed, SALT]``), apart from the sampling's
SALT = 0x9E3C0


def _spec_ok(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, numbers.Integral):
        return int(v) >= 1
    if isinstance(v, float):
        return 0 < v < 1
    if isinstance(v, list):
        return len(v) >= 1 and all(isinstance(p, numbers.Integral) and not isinstance(p, bool)
                                   and int(p) >= 0 for p in v) and len(set(v)) == len(v)
    return False


class number(abc.ABC):  # noqa: N801, B024 - named as an error names it; register() only
    """An int or a float as it is (check_value turns an int into a float where ``float`` is
    among the types; here a count stays an integer, a fraction a float)."""


number.register(int)
number.register(float)

NEWCOMER_FIELDS: dict[str, Field] = {
    "newcomers.clients": Field((number, list), None, _spec_ok, "null, an integer >= 1 (how many), "
                               "a number in (0, 1) (a fraction of clients) or a list of "
                               "distinct partition-ids", nullable=True),
    "newcomers.budget-steps": Field((int,), None, POS, "an integer >= 1 or null (the local "
                                    "SGD steps every newcomer adapts with; null: the run's "
                                    "local training, train.steps or train.epochs passes)",
                                    nullable=True),
    "newcomers.every": Field((int,), None, POS, "an integer >= 1 or null (newcomers evaluated "
                             "every k rounds, a multiple of eval-every, and in the last round; "
                             "null: eval-every)", nullable=True),
}


def count_of(spec: Any, clients: int) -> int:
    """How many clients ``spec`` holds out of ``clients`` (0 for null)."""
    if spec is None:
        return 0
    if isinstance(spec, list):
        return len(spec)
    if isinstance(spec, float):
        return max(1, int(round(spec * clients)))
    return int(spec)


def participants(values: Mapping[str, Any]) -> int:
    """How many clients take part: ``clients`` less the held-out newcomers (the population
    a round samples from, and the count the participants' statistics cover)."""
    clients = int(values["clients"])
    return clients - count_of(values.get("newcomers.clients"), clients)


def held_out(values: Mapping[str, Any]) -> list[int]:
    """The held-out partition-ids of a validated configuration, sorted: the given list, or
    ``count_of`` ids drawn without replacement from ``range(clients)`` by
    ``numpy.random.default_rng([seed, SALT])`` -- the same for the same seed, drawn apart
    from the participants' sampling stream.  [] without newcomers."""
    spec, n = values.get("newcomers.clients"), int(values["clients"])
    if spec is None:
        return []
    if isinstance(spec, list):
        return sorted(int(p) for p in spec)
    rng = np.random.default_rng([int(values["seed"]), SALT])
    return sorted(int(p) for p in rng.choice(n, size=count_of(spec, n), replace=False))


def is_newcomer_round(values: Mapping[str, Any], server_round: int) -> bool:
    """Whether newcomers are evaluated after ``server_round``: every ``newcomers.every``
    (null: ``eval-every``) rounds and in the last round."""
    every = values.get("newcomers.every") or values["eval-every"]
    return server_round % int(every) == 0 or server_round >= int(values["rounds"])


def newcomer_checks(values: Mapping[str, Any]) -> list[str]:
    """The ``newcomers.*`` problems that need more than one key."""
    spec, n = values.get("newcomers.clients"), int(values["clients"])
    if spec is None:
        return [f"'{k}' = {values[k]!r} is set but newcomers.clients is null (no newcomer "
                f"to adapt or evaluate)" for k in ("newcomers.budget-steps", "newcomers.every")
                if values.get(k) is not None]
    problems = []
    if isinstance(spec, list) and any(p >= n for p in spec):
        problems.append(f"'newcomers.clients' = {spec!r} names partition-id(s) "
                        f"{sorted(p for p in spec if p >= n)} outside [0, {n}) of 'clients'")
    k = count_of(spec, n)
    participants = n - k
    if participants < max(1, int(values["min-fit-clients"])):
        problems.append(f"'newcomers.clients' = {spec!r} holds out {k} of {n} clients, leaving "
                        f"{participants} participant(s): fewer than min-fit-clients = "
                        f"{values['min-fit-clients']}")
    sampled = max(int(values["min-fit-clients"]),
                  int(round(values["fraction-fit"] * participants)))
    if participants >= 1 and values["min-fit-answers"] > min(sampled, participants):
        problems.append(f"'min-fit-answers' = {values['min-fit-answers']} can never be met: "
                        f"a round samples {min(sampled, participants)} of the {participants} "
                        f"participants (newcomers are never sampled)")
    every = values.get("newcomers.every")
    if every is not None and every % int(values["eval-every"]):
        problems.append(f"'newcomers.every' = {every} is not a multiple of 'eval-every' = "
                        f"{values['eval-every']}: newcomers are evaluated with the "
                        f"participants' evaluation rounds")
    return problems


def newcomer_stats(participants_mean: float, before: Sequence[float],
                   after: Sequence[float]) -> dict[str, float]:
    """A round's newcomer columns (rounds.csv, summary.json, TensorBoard, the console):
    ``newcomers_before_mean`` / ``newcomers_after_mean`` (the metric's mean over newcomers
    before / after their rule), ``participation_gap`` = after mean - ``participants_mean``
    (the participants' personalized mean), ``adaptation_gain`` = after mean - before mean,
    and ``newcomers_evaluated``.  Means are unweighted over clients; NaN without answers."""
    b = float(np.mean(before)) if len(before) else math.nan
    a = float(np.mean(after)) if len(after) else math.nan
    return {"newcomers_evaluated": float(len(after)), "newcomers_before_mean": b,
            "newcomers_after_mean": a, "participation_gap": a - float(participants_mean),
            "adaptation_gain": a - b}


def rules_table() -> str:
    """The Markdown table of docs/newcomers.md: each registered strategy's newcomer rule
    and its basis, from the contracts (``Entry.newcomer``; tests/test_newcomers.py keeps the
    doc equal to it)."""
    from flower_pfl.registry import REGISTRY  # every catalog module: only here

    rows = ["| strategy | newcomer rule | basis |", "|---|---|---|"]
    for name in sorted(REGISTRY):
        rule = REGISTRY[name].newcomer
        rows.append(f"| `{name}` | " + ("not declared yet: `newcomers` is refused" if rule is None
                                         else f"refused: {rule.refused}" if rule.refused
                                         else f"{rule.rule} | {rule.basis}") +
                    (" | - |" if rule is None or rule.refused else " |"))
    return "\n".join(rows) + "\n"
