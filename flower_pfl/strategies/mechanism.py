"""How often a strategy's own mechanism ran, per run, counted once for every strategy.

Many personalized methods need history before their mechanism does anything: Self-FL's
eq. 8/10 need sigma_m^2 and S_{-m}; FedAMP's cloud model, Ditto's v_i, FedRep's head,
APFL's v_i and alpha_i, SCAFFOLD's c_i, pFedHN's embedding, PLGU's personal layers only
carry a client's own state after its first accepted upload.  Before that the client falls
back (global or initial model, zero control variate, ...).  With few rounds and partial
participation a run can end without the mechanism ever running -- silently the baseline.

A paper's contract declares only WHAT its mechanism is (``Entry(..., mechanism=Mechanism(...))``,
flower_pfl/contract.py), and the strategy, if
"ran" is not simply "the client had an accepted upload in an earlier round" (HISTORY),
``mechanism_used(update, carried)``.  The base (strategies/base.py) counts every accepted
upload as one client-round, the evaluation mixin logs one line at the end of the run
(WARNING when the mechanism never ran) and ``summary.json`` gets the counts
(``mechanism``: name, what, used, client_rounds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flower_pfl.contract import Mechanism


@dataclass
class MechanismCount:
    """Client-rounds in which the mechanism ran, out of all accepted uploads."""

    used: int = 0
    client_rounds: int = 0
    per_round: dict[int, list[int]] = field(default_factory=dict)  # round -> [used, total]

    def add(self, server_round: int, used: bool) -> None:
        self.used += int(bool(used))
        self.client_rounds += 1
        row = self.per_round.setdefault(int(server_round), [0, 0])
        row[0] += int(bool(used))
        row[1] += 1

    def summary(self, mechanism: Mechanism) -> dict[str, Any]:
        """The counts as ``summary.json`` holds them."""
        return {"name": mechanism.name, "what": mechanism.what,
                "otherwise": mechanism.otherwise, "used": self.used,
                "client_rounds": self.client_rounds,
                "never_used": self.used == 0}

    def line(self, mechanism: Mechanism) -> str:
        """The end-of-run line; with the hint when the mechanism never ran."""
        text = (f"{mechanism.name}: {mechanism.what} used in {self.used} of "
                f"{self.client_rounds} client-rounds (otherwise {mechanism.otherwise})")
        return text + (f" — {mechanism.hint}" if self.used == 0 else "")
