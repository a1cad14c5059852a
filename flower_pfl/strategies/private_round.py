"""Differential privacy's server side in a round (docs/privacy.md), written once.

A mixin of ``PersonalizedStrategy`` (``self.dp``: client-level DP's clip, noise and
accountant, :class:`flower_pfl.privacy.server_side.ClientLevelDP`, None otherwise;
``self.privacy_mode``; both set in its ``__init__``).  The math lives in
:mod:`flower_pfl.privacy`; here is where a round meets it:

* :meth:`PrivateRound.require_privacy_budget`: before a round is sent, a run whose next
  round would take client-level DP's ε past ``privacy.target-epsilon`` stops (e.g. resuming
  a spent run);
* :meth:`PrivateRound.clip_upload`: under DP an upload's norm bound clips it, never rejects
  it (called by ``check_uploads``, :mod:`.uploads`; what each client was sent is kept by
  ``fit_instructions``, :mod:`.payloads`, which also sends client-level DP's per-client
  share);
* :meth:`PrivateRound.private_round`: what ``aggregate_updates`` gets -- client-level:
  weighted equally, the server's noise added, the round accounted (server.csv
  ``epsilon``); sample-level: the largest per-client ε reported (``epsilon_max``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from flower_pfl.instructions import SampleLevelReply
from flower_pfl.privacy.clipping import clip_update
from flower_pfl.privacy.fields import weak_delta
from flower_pfl.reliability.uploads import UploadTemplate
from flower_pfl.strategies.federation import ClientUpdate, RoundError
from flower_pfl.strategies.state import StrategyState
from flower_pfl.warnings_once import warn_once


class PrivateRound(StrategyState):
    """The budget check, the clipping and the noisy aggregate's input (module docstring)."""

    def require_privacy_budget(self, server_round: int) -> None:
        """Raise RoundError when round ``server_round`` would take client-level DP's ε past
        ``privacy.target-epsilon`` (nothing without client-level DP)."""
        if self.dp is not None and self.dp.next_round_exceeds():  # e.g. resuming a spent run
            raise RoundError(f"round {server_round} would take client-level DP's ε past "
                             f"privacy.target-epsilon = {self.dp.target} (ε now "
                             f"{self.dp.epsilon():.4g}): the budget is spent")

    def clip_upload(self, pid: int, arrays: list[np.ndarray], template: UploadTemplate,
                    max_norm: float | None) -> list[np.ndarray]:
        """Under DP an upload's norm bound clips it (a rejection would depend on the data and
        break the guarantee): client-level clips its whole update (model part against what
        was sent, extra parts against zero, one vector) to privacy.clip-norm; otherwise
        ``max-update-norm`` clips the model's update and each bounded extra part."""
        model, extra = template.split(arrays)
        sent = self._sent_arrays.get(pid)
        if self.dp is not None:
            model, extra, _ = self.dp.clip_upload(model, extra, sent)
        elif max_norm is not None:
            model = clip_update(model, sent, max_norm)[0]
            extra = {k: clip_update(v, None, max_norm)[0] if k in template.bounded else v
                     for k, v in extra.items()}
        return [*model, *(a for part in extra.values() for a in part)]

    def private_round(self, server_round: int, updates: list[ClientUpdate]
                      ) -> list[ClientUpdate]:
        """What ``aggregate_updates`` gets, sorted by partition-id.  Client-level DP:
        copies weighted equally (num_examples 1: a sample-weighted mean would let one
        client weigh more than 1/n), the server's noise added (privacy/server_side.py), the
        round accounted (server.csv: epsilon).  Sample-level: the largest per-client ε
        reported (epsilon_max)."""
        ordered = sorted(updates, key=lambda u: u.pid)
        self.warn_weak_delta(ordered)
        if self.dp is not None:
            ordered = [replace(u, num_examples=1) for u in ordered]
            self.dp.add_noise(ordered)
            self.log_server(**self.dp.record(
                ordered, int(self._round_server_log.get("sampled", len(ordered)))))
        elif self.privacy_mode == "sample-level":
            eps = [float(u.metrics["dp_epsilon"]) for u in updates if "dp_epsilon" in u.metrics]
            self.log_server(epsilon_max=round(max(eps), 6) if eps else float("nan"))
        return ordered

    def warn_weak_delta(self, updates: list[ClientUpdate]) -> None:
        """A δ >= 1/n for the unit it protects is named once per run (a WARNING in the
        log): client-level's against N clients, sample-level's (each reply's ``dp_delta``)
        against that client's training examples (its ``num_examples``)."""
        if self.dp is not None:
            weak = weak_delta(self.dp.accountant.delta, self.dp.accountant.num_clients,
                              "clients")
            if weak:
                warn_once(self.warned, "weak-delta", "client-level DP: %s", weak)
            return
        for u in updates:
            delta = SampleLevelReply.from_config(u.metrics).dp_delta
            weak = weak_delta(delta, int(u.num_examples), f"training examples of client "
                              f"{u.pid}") if delta is not None and u.num_examples else None
            if weak:
                warn_once(self.warned, "weak-delta", "sample-level DP (and maybe other "
                          "clients): %s", weak)
