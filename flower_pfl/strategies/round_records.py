"""What a round's fit side records: server-side quantities, the mechanism's use, Flower's
metrics, written once.

A mixin of ``PersonalizedStrategy`` (``self._round_server_log``, ``self.mechanism``,
``self.mechanism_count`` and ``self.warned``, set in its ``__init__``):

* :meth:`RoundRecords.log_server` collects the round's server-side quantities; :mod:`.base`'s
  ``aggregate_fit`` writes them as the round's ``server.csv`` row (and each client's upload
  metrics as ``fit.csv`` rows: :class:`flower_pfl.reporting.results.ResultsWriter`);
* :meth:`RoundRecords.count_mechanism` counts each accepted upload as one client-round that
  ran the strategy's own mechanism or not (:meth:`RoundRecords.mechanism_used`, a subclass
  hook; :mod:`.mechanism`; the end-of-run line is :mod:`.evaluation`'s);
* :func:`fit_metrics` is what ``aggregate_fit`` reports to Flower;
* :meth:`RoundRecords.warn_once` gives a WARNING once per run and key.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from flwr.common import Scalar

from flower_pfl.strategies.federation import ClientUpdate
from flower_pfl.strategies.state import StrategyState
from flower_pfl.warnings_once import warn_once


class RoundRecords(StrategyState):
    """log_server, the mechanism's count and warn_once (module docstring)."""

    def mechanism_used(self, update: ClientUpdate, carried: bool) -> bool:
        """Whether ``update``'s client-round ran the strategy's mechanism.  Default (history):
        ``carried`` = the client had an accepted upload in an earlier round, so the state
        the mechanism builds on (personal model, head, v_i, c_i, stored w_i) was its own."""
        return carried

    def warn_once(self, key: Any, message: str, *args: object) -> bool:
        """A WARNING logged the first time ``key`` comes up in this run
        (:func:`flower_pfl.warnings_once.warn_once`)."""
        return warn_once(self.warned, key, message, *args)

    def log_server(self, **values: Any) -> None:
        """Record server-side per-round quantities (written to server.csv and the log)."""
        self._round_server_log.update(values)

    def count_mechanism(self, server_round: int, updates: list[ClientUpdate],
                        carried: Mapping[int, bool]) -> None:
        """Each accepted client-round used the strategy's mechanism or not (mechanism.py)."""
        if self.mechanism is not None:
            for u in updates:
                self.mechanism_count.add(server_round, self.mechanism_used(u, carried[u.pid]))


def fit_metrics(updates: Sequence[ClientUpdate], failed: Sequence[tuple[int, str]]
                ) -> dict[str, Scalar]:
    """What aggregate_fit reports to Flower: counts and the mean training loss."""
    train_losses = [float(u.metrics["train_loss"]) for u in updates if "train_loss" in u.metrics]
    metrics: dict[str, Scalar] = {"fit_clients": len(updates), "fit_failures": len(failed)}
    if train_losses:
        metrics["train_loss"] = float(np.mean(train_losses))
    return metrics
