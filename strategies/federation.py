"""Who is in the federation and what came back from it -- no strategy logic.

* :class:`TaggedProxy` wraps a node's ``ClientProxy`` so that a failed message reaches
  ``aggregate_*`` as a :class:`ClientFailure` carrying the partition-id and a readable
  reason (Flower's legacy loop hands over bare exceptions);
* :class:`ClientUpdate` is one accepted upload, :class:`ClientStore` all server-side
  per-client state (checkpointed whole);
* the errors a run stops with: :class:`FederationError` (nodes do not match the
  configuration), :class:`RoundError` (too few answers), :class:`ResumeError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.common import Code, Scalar
from flwr.server.client_proxy import ClientProxy


class FederationError(RuntimeError):
    """The federation does not match the configuration (node count, partition ids)."""


class RoundError(RuntimeError):
    """Too few clients answered a round (``min-fit-answers`` / ``min-eval-answers``)."""


class ResumeError(RuntimeError):
    """The results folder cannot be resumed (no checkpoint, another configuration)."""


class ClientFailure(Exception):
    """A client's message failed: it raised, timed out or its node disconnected."""

    def __init__(self, pid: int, reason: str) -> None:
        super().__init__(f"partition-id {pid}: {reason}")
        self.pid = pid
        self.reason = reason


def failure_reason(exc: BaseException) -> str:
    """One line saying why a message to a client failed (timeout, client error, other)."""
    text = str(exc)
    if "Expected one Message but got: 0" in text:
        return "no reply (timed out or node disconnected)"
    if "Message contains an Error" in text:
        return "client raised: " + text.split("reason:", 1)[-1].strip()[:400]
    return f"{type(exc).__name__}: {text[:400]}"


class TaggedProxy(ClientProxy):
    """Wraps a node's ClientProxy so that a failure carries the partition-id and a reason
    (Flower's legacy loop hands bare exceptions to ``aggregate_*``)."""

    def __init__(self, proxy: ClientProxy, pid: int) -> None:
        super().__init__(proxy.cid)
        self.proxy, self.pid = proxy, pid

    def _call(self, name: str, ins, timeout, group_id):
        try:
            res = getattr(self.proxy, name)(ins, timeout, group_id)
        except BaseException as exc:  # noqa: BLE001 - Flower collects these as failures
            raise ClientFailure(self.pid, failure_reason(exc)) from exc
        if res.status.code != Code.OK:
            raise ClientFailure(self.pid, f"status {res.status.code.name}: "
                                f"{res.status.message[:400]}")
        return res

    def get_properties(self, ins, timeout, group_id):
        return self.proxy.get_properties(ins, timeout, group_id)

    def get_parameters(self, ins, timeout, group_id):
        return self.proxy.get_parameters(ins, timeout, group_id)

    def fit(self, ins, timeout, group_id):
        return self._call("fit", ins, timeout, group_id)

    def evaluate(self, ins, timeout, group_id):
        return self._call("evaluate", ins, timeout, group_id)

    def reconnect(self, ins, timeout, group_id):
        return self.proxy.reconnect(ins, timeout, group_id)


@dataclass
class ClientUpdate:
    """One client's upload of one round."""

    pid: int
    arrays: list[np.ndarray]
    num_examples: int
    metrics: dict[str, Scalar] = field(default_factory=dict)
    extra: dict[str, list[np.ndarray]] = field(default_factory=dict)  # the template's extras


class ClientStore:
    """All server-side per-client state, keyed by partition-id, in one checkpointable place.

    ``values[name][pid]`` holds scalars/arrays a strategy keeps per client (e.g. Self-FL's
    sigma_m^2); strategies with a model per client keep a ``ModelMatrix`` in ``matrix``.
    """

    def __init__(self, num_clients: int) -> None:
        self.num_clients = num_clients
        self.values: dict[str, dict[int, Any]] = {}
        self.matrix: Any = None
        self.last_round: dict[int, int] = {}  # pid -> last round it uploaded

    def put(self, name: str, pid: int, value: Any) -> None:
        self.values.setdefault(name, {})[pid] = value

    def get(self, name: str, pid: int, default: Any = None) -> Any:
        return self.values.get(name, {}).get(pid, default)
