"""What a round accepts from its clients: every upload checked, failures recorded, written once.

A mixin of ``PersonalizedStrategy``; :mod:`.base`'s ``aggregate_fit`` takes a round's
answers through these steps, in this order, before any state sees them:

* :meth:`UploadAcceptance.check_uploads`: the claimed partition-id, then the upload held to
  this round's :meth:`UploadAcceptance.template` (the model part, ``upload_template``, and
  the extra parts, ``upload_extra``: subclass hooks) by
  :mod:`flower_pfl.reliability.upload_checks` (``upload_problem``); under DP a norm bound
  clips instead (``clip_upload``, :mod:`.private_round`); each accepted upload becomes a
  :class:`~.federation.ClientUpdate` (``client_update``: kept serialised where the class
  says ``lazy_uploads``);
* :meth:`UploadAcceptance.record_failures`: rejected uploads and failed clients logged by
  partition-id with the reason (the log, ``failures.csv``; evaluation's failures too);
* :meth:`UploadAcceptance.accept`: the accepted ones' round is kept (clients commit personal
  state only for an accepted round, clients/state.py);
* :meth:`UploadAcceptance.require_min_fit_answers`: fewer than ``min-fit-answers`` accepted
  ends the run (:class:`~.federation.RoundError`).

Open choice: a rejected client's server-side state is left untouched and the round goes on
with the others.  (:mod:`flower_pfl.reliability.uploads` is the upload's layout,
``UploadTemplate``; this module is the strategy's side of it.)
"""

from __future__ import annotations

from logging import WARNING
from typing import Any, Mapping, Sequence

import numpy as np
from flwr.common import FitRes, bytes_to_ndarray, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.client_proxy import ClientProxy

from flower_pfl.reliability.uploads import UploadTemplate
from flower_pfl.store_rows import LazyArrays
from flower_pfl.strategies.federation import (
    ClientFailure,
    ClientUpdate,
    RoundError,
    failure_reason,
)
from flower_pfl.strategies.state import StrategyState


class UploadAcceptance(StrategyState):
    """The upload's template (hooks), its checks and the round's acceptance (module
    docstring)."""

    # ------------------------------------------------------------ the upload's parts
    def upload_template(self) -> list[np.ndarray]:
        """Arrays shaped like one client's upload (called after ``setup``/a resume): the
        upload check holds every upload to these shapes and dtypes.  Default: the whole
        model; a strategy whose clients upload a part (FedRep: the body) returns that."""
        return self._initial if self._initial is not None else []

    def upload_extra(self, server_round: int) -> dict[str, list[np.ndarray]]:
        """The extra part of this round's uploads, after the model part: named arrays shaped
        like what each client adds (Self-FL's d_m, SCAFFOLD's dc_i), held to the same upload
        check as the model's; they reach ``aggregate_updates`` as ``ClientUpdate.extra``."""
        return {}

    def bounded_extra(self) -> frozenset[str]:
        """Extra parts that are updates in the model's units: max-update-norm bounds each."""
        return frozenset()

    def template(self, server_round: int) -> UploadTemplate:
        """This round's upload: the model part and the extra part."""
        return UploadTemplate(self.upload_template() or [], self.upload_extra(server_round),
                              self.bounded_extra())

    # ------------------------------------------------------------------ the checks
    def check_uploads(self, server_round: int, results: list[tuple[ClientProxy, FitRes]]
                      ) -> tuple[list[ClientUpdate], list[ClientFailure]]:
        """(the accepted uploads as ClientUpdates, a ClientFailure for each rejected one)."""
        updates, rejected = [], []
        max_norm = self.cfg.values.get("max-update-norm")
        template = self.template(server_round)
        for proxy, res in results:
            pid = self.proxy_pid(proxy)
            arrays = parameters_to_ndarrays(res.parameters)
            reason = self.upload_problem(pid, arrays, res, template, max_norm)
            if reason is not None:
                rejected.append(ClientFailure(pid, f"update rejected: {reason}"))
                continue
            if self.dp is not None or (self.privacy_mode != "none" and max_norm is not None):
                # under DP a norm bound clips, never rejects (a lazy store's bytes kept else)
                arrays = self.clip_upload(pid, arrays, template, max_norm)
                updates.append(self.client_update(pid, arrays, res, template, lazy=False))
                continue
            updates.append(self.client_update(pid, arrays, res, template))
        return updates, rejected

    def upload_problem(self, pid: int, arrays: list[np.ndarray], res: FitRes,
                       template: UploadTemplate, max_norm: float | None) -> str | None:
        """Why partition ``pid``'s upload must be rejected, or None (upload_checks.py)."""
        claimed = res.metrics.get("partition-id", pid)
        if int(claimed) != pid:
            return f"the upload claims partition-id {claimed!s}"
        if self.uploads_model or arrays:
            return template.check(arrays, res.num_examples, res.metrics, self._sent.get(pid),
                                  max_norm, clip=self.privacy_mode != "none")
        return None

    def client_update(self, pid: int, arrays: list[np.ndarray], res: FitRes,
                      template: UploadTemplate, lazy: bool | None = None) -> ClientUpdate:
        """An accepted upload split into its model part and its named extra parts
        (``lazy``: None = the class's ``lazy_uploads``; False: ``arrays`` as given)."""
        model: Sequence[np.ndarray]
        extra: Mapping[str, Sequence[np.ndarray]]
        if self.lazy_uploads if lazy is None else lazy:  # decoded again when read
            blobs, blob_parts = template.split(res.parameters.tensors)
            model = LazyArrays(blobs, bytes_to_ndarray)
            extra = {k: LazyArrays(v, bytes_to_ndarray) for k, v in blob_parts.items()}
        else:
            model, extra = template.split(arrays)
        update = ClientUpdate(pid, model, int(res.num_examples), dict(res.metrics))
        update.extra = extra  # the named extra parts (upload_extra)
        return update

    # -------------------------------------------------- failures and the round's acceptance
    def record_failures(self, server_round: int, phase: str, failures: list[Any]
                        ) -> list[tuple[int, str]]:
        """(partition-id, reason) of every failed message; logged and kept in failures.csv."""
        out = []
        for f in failures:
            if isinstance(f, ClientFailure):
                out.append((f.pid, f.reason))
            elif isinstance(f, tuple) and len(f) == 2:  # (proxy, result with a bad status)
                out.append((self.proxy_pid(f[0]), f"status: {f[1].status.message[:400]}"))
            else:
                out.append((-1, failure_reason(f)))
        for pid, reason in out:
            log(WARNING, "[flower-pfl] round %d: %s of partition-id %d failed: %s", server_round,
                phase, pid, reason)
        self.results.log_failures(server_round, phase, out)
        return out

    def accept(self, server_round: int, updates: list[ClientUpdate]) -> dict[int, bool]:
        """Record the round of each accepted upload (clients keep this round's state);
        returns whether each client had an accepted upload before (``mechanism_used``)."""
        carried = {u.pid: self.store.last_round.get(u.pid, 0) > 0 for u in updates}
        for u in updates:
            self.store.last_round[u.pid] = server_round  # accepted: clients keep this round
        return carried

    def require_min_fit_answers(self, server_round: int, updates: list[ClientUpdate],
                                failed: list[tuple[int, str]]) -> None:
        """Raise RoundError when fewer than ``min-fit-answers`` uploads were accepted, after
        the round's server.csv row (``fit_ok``, ``fit_failed``: the summary's coverage counts
        the failed fits of the round that ended the run).  The error names each failure by
        its reason's first line (a client's exception: its type and message)."""
        minimum = int(self.cfg.values.get("min-fit-answers", 1))
        if len(updates) < minimum:
            self.log_server(fit_ok=len(updates), fit_failed=len(failed),
                            fit_failed_ids=" ".join(str(p) for p, _ in sorted(failed)))
            self.results.log_server(server_round, self.round_server_log)
            raise RoundError(
                f"round {server_round}: {len(updates)} valid update(s) from "
                f"{len(updates) + len(failed)} sampled client(s), fewer than min-fit-answers = "
                f"{minimum}; failures: " + "; ".join(
                    f"partition-id {p}: {r.splitlines()[0] if r else r}" for p, r in failed[:10]))
