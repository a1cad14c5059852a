"""What each sampled client is sent: its arrays and its config, written once.

A mixin of ``PersonalizedStrategy`` (:mod:`.base`'s ``configure_fit`` calls
:meth:`FitPayloads.fit_instructions` once the round's clients are sampled and
``prepare_round`` has run):

* :meth:`FitPayloads.fit_payload` (the model part and the paper's config, a subclass hook:
  default the global model) and :meth:`FitPayloads.fit_extra` (named arrays after the
  model, e.g. SCAFFOLD's c) are the paper's;
* :meth:`FitPayloads.fit_instructions` turns them into each client's ``FitIns``: it keeps
  what the client starts from (the norm check's reference under ``max-update-norm``, the
  clipping reference under DP: :mod:`.uploads`, :mod:`.private_round`), adds client-level
  DP's per-client share (``ClientLevelDP.client_config``) and names the extra parts in the
  config (``EXTRA_ARRAYS``);
* :meth:`FitPayloads.base_config` is what every message carries, fit and evaluate
  (:class:`flower_pfl.instructions.RoundInstruction`), then the payload's own config.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
from flwr.common import FitIns, Scalar, ndarrays_to_parameters
from flwr.server.client_proxy import ClientProxy

from flower_pfl.instructions import RoundInstruction
from flower_pfl.reliability.upload_checks import flat
from flower_pfl.reliability.uploads import EXTRA_ARRAYS, describe_parts
from flower_pfl.strategies.federation import TaggedProxy
from flower_pfl.strategies.state import StrategyState


class FitPayloads(StrategyState):
    """fit_payload / fit_extra (hooks) and the FitIns built from them (module docstring)."""

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        """Arrays and config sent to sampled client ``pid`` (default: the global model and
        :meth:`fit_config`)."""
        return self.global_arrays or [], self.fit_config(pid, server_round)

    def fit_config(self, pid: int, server_round: int) -> Mapping[str, Scalar]:
        """The paper's instruction to sampled client ``pid`` (its contract's Wire class,
        ``to_config()``; e.g. FedProx's mu, FedAMP's prox weight).  Default: none."""
        return {}

    def fit_extra(self, pid: int, server_round: int) -> dict[str, list[np.ndarray]]:
        """Named arrays sent after the model to sampled client ``pid`` (SCAFFOLD's c); the
        client splits them off with ``PFLClient.split_download``."""
        return {}

    def fit_instructions(self, server_round: int, sampled: list[int]
                         ) -> list[tuple[ClientProxy, FitIns]]:
        """Each sampled client's ``FitIns`` (its payload, extra arrays and config); what it
        starts from is kept for this round's upload checks and clipping."""
        instructions: list[tuple[ClientProxy, FitIns]] = []
        max_norm = self.cfg.values.get("max-update-norm")
        self._sent, self._sent_arrays = {}, {}
        for pid in sampled:
            arrays, extra = self.fit_payload(pid, server_round)
            start = arrays if arrays else self._initial  # what the client starts from
            if max_norm is not None:  # the update's starting point, for the norm check
                assert start is not None, "initialize_parameters sets the initial model"
                self._sent[pid] = flat(start)
            if self.privacy_mode != "none":  # ... and for clipping it (docs/privacy.md)
                assert start is not None, "initialize_parameters sets the initial model"
                self._sent_arrays[pid] = list(start)
            if self.dp is not None:  # the client's clip, reference and noise share
                extra = {**extra, **self.dp.client_config(len(sampled))}
            extra_arrays = self.fit_extra(pid, server_round)
            if extra_arrays:  # after the model, named in the config
                arrays = [*arrays, *(a for part in extra_arrays.values() for a in part)]
                extra = {**extra, EXTRA_ARRAYS: describe_parts(extra_arrays)}
            config = self.base_config(server_round, extra, pid)
            instructions.append((TaggedProxy(self.proxies[pid], pid),
                                 FitIns(ndarrays_to_parameters(arrays), config)))
        return instructions

    def base_config(self, server_round: int, extra: Mapping[str, Scalar],
                    pid: int | None = None) -> dict[str, Scalar]:
        """What every message carries (the strategy, the round, the run's id, the client's
        last accepted round; the configuration where the clients cannot read it from the run
        config: ``cfg_travels``), then ``extra``."""
        config = RoundInstruction(
            self.cfg.strategy, server_round, self.run_uid,
            cfg=self.cfg_json if self.cfg_travels else None,
            # the last round whose upload the server accepted from pid
            accepted_round=None if pid is None else int(self.store.last_round.get(pid, 0)),
        ).to_config()
        return {**config, **extra}
