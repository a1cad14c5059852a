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

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from flwr.common import (
    Code,
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    ReconnectIns,
    Scalar,
)
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


# Flower's reason for a ClientApp's exception (run_clientapp, the simulation's worker):
# "<class 'T'>:<'message'>"; under Ray T is "ray.exceptions.RayTaskError(ClientAppException)"
# and the message Ray's traceback of the actor, the user's exception in its middle
CLIENT_EXCEPTION = re.compile(r"^<class '([^']+)'>:<'(.*)'>$", re.S)
MAX_REASON = 4000  # characters of a client's exception kept (a whole tensor would not fit)
#: a terminal's colour codes (Ray colours its tracebacks' process titles)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: a traceback's exception line: an unindented dotted name, then ": message" or nothing
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|"
                            r"Failure|Fault)|[A-Za-z_][\w]*\.[\w.]*[A-Z]\w*)(?::\s?(.*))?$")
#: a traceback's first line: Python's, or Ray's process title for an actor's traceback
TRACEBACK_HEAD = re.compile(r"^(Traceback \(most recent call last\)|ray::\S+\(\) \()")
#: Flower's wrapper of a ClientApp's exception (its text repeats the cause's message)
WRAPPERS = ("ClientAppException", "RayTaskError")
REJOIN = ("start its `flower-pfl supernode` again with the same command (it rejoins under "
          "its node id with its state from --state-dir); the run goes on without it meanwhile")


def _whole(text: str) -> str:
    """``text`` up to MAX_REASON characters: the middle cut, so a traceback keeps its head
    (where it ran) and its end (what was raised)."""
    cut = len(text) - MAX_REASON
    if cut <= 0:
        return text
    head = MAX_REASON // 3
    return f"{text[:head]} ... ({cut} characters cut) ... {text[-(MAX_REASON - head):]}"


def root_exception(text: str) -> str | None:
    """The first exception line (``Type: message``) of a traceback in ``text`` (Python's,
    or Ray's, which heads each part with the actor's ``ray::Class.method() (pid=...)``),
    ANSI codes stripped, skipping Flower's and Ray's wrappers (:data:`WRAPPERS`): with ``raise ...
    from ex`` the cause's traceback comes first, so this is the user's exception.  None
    where ``text`` holds no traceback."""
    lines = ANSI.sub("", text).splitlines()
    after = False
    for line in lines:
        if TRACEBACK_HEAD.match(line):
            after = True
            continue
        if not after or not line or line[0].isspace():
            continue
        match = EXCEPTION_LINE.match(line)
        if match is None:
            continue
        after = False
        name, message = match.group(1).rsplit(".", 1)[-1], match.group(2)
        if not any(w in name for w in WRAPPERS):
            return f"{name}: {message}" if message else name
    return None


def failure_reason(exc: BaseException) -> str:
    """Why a message to a client failed, with the fix: no reply, its node gone (Flower's
    Node/Message Unavailable errors), or the client's own exception: its type and message
    first, on the first line (under Ray read out of the actor's traceback,
    :func:`root_exception`; then, on the next lines, that traceback), the text with ANSI
    codes stripped and cut in the middle at MAX_REASON characters (its message names the
    fix, e.g. a refused shard's remake command)."""
    text = ANSI.sub("", str(exc))
    if "Expected one Message but got: 0" in text:
        return "no reply (timed out or node disconnected)"
    if "Message contains an Error" not in text:
        return f"{type(exc).__name__}: {_whole(text)}"
    reason = text.split("(reason: ", 1)[-1]
    reason = reason.rsplit("). It originated during client-side execution", 1)[0].strip()
    if "Node Unavailable" in reason:
        return ("node gone: its SuperNode stopped sending heartbeats (stopped, crashed or cut "
                "off from the SuperLink; Flower: Node Unavailable). Fix: " + REJOIN)
    if "Message Unavailable" in reason or "message objects are unavailable" in reason:
        return ("node gone or too slow: no reply before the message expired at round-timeout "
                "(its SuperNode went away mid-round -- stopped, crashed or cut off from the "
                "SuperLink -- or took longer than round-timeout; Flower: Message Unavailable). "
                "Fix: if it went away, " + REJOIN + "; if it is slow, raise round-timeout")
    match = CLIENT_EXCEPTION.match(reason)
    if match:  # flower_pfl.learning.shards.ShardError -> ShardError
        kind, message = match.group(1).rsplit(".", 1)[-1], match.group(2)
        root = root_exception(message)
        if root is not None:  # Ray: the user's exception, then Ray's traceback
            return f"client raised {root}\n{_whole(message.strip())}"
        reason = f"{kind}: {message}"
    return "client raised: " + _whole(reason)


class TaggedProxy(ClientProxy):
    """Wraps a node's ClientProxy so that a failure carries the partition-id and a reason
    (Flower's legacy loop hands bare exceptions to ``aggregate_*``)."""

    def __init__(self, proxy: ClientProxy, pid: int) -> None:
        super().__init__(proxy.cid)
        self.proxy, self.pid = proxy, pid

    def _call(self, name: str, ins: FitIns | EvaluateIns, timeout: float | None,
              group_id: int | None) -> Any:
        try:
            res = getattr(self.proxy, name)(ins, timeout, group_id)
        except BaseException as exc:  # noqa: BLE001 - Flower collects these as failures
            raise ClientFailure(self.pid, failure_reason(exc)) from exc
        if res.status.code != Code.OK:
            raise ClientFailure(self.pid, f"status {res.status.code.name}: "
                                f"{res.status.message[:400]}")
        return res

    def get_properties(self, ins: GetPropertiesIns, timeout: float | None,
                       group_id: int | None) -> GetPropertiesRes:
        return self.proxy.get_properties(ins, timeout, group_id)

    def get_parameters(self, ins: GetParametersIns, timeout: float | None,
                       group_id: int | None) -> GetParametersRes:
        return self.proxy.get_parameters(ins, timeout, group_id)

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        res: FitRes = self._call("fit", ins, timeout, group_id)
        return res

    def evaluate(self, ins: EvaluateIns, timeout: float | None,
                 group_id: int | None) -> EvaluateRes:
        res: EvaluateRes = self._call("evaluate", ins, timeout, group_id)
        return res

    def reconnect(self, ins: ReconnectIns, timeout: float | None,
                  group_id: int | None) -> DisconnectRes:
        return self.proxy.reconnect(ins, timeout, group_id)


@dataclass
class ClientUpdate:
    """One client's upload of one round."""

    pid: int
    #: the model part (a list, or ``model_store.LazyArrays`` decoding each array when read)
    arrays: Sequence[np.ndarray]
    num_examples: int
    metrics: dict[str, Scalar] = field(default_factory=dict)
    extra: Mapping[str, Sequence[np.ndarray]] = field(default_factory=dict)  # the extras


class ClientStore:
    """All server-side per-client state, keyed by partition-id, in one checkpointable place.

    ``values[name][pid]`` holds scalars/arrays a strategy keeps per client (e.g. Self-FL's
    sigma_m^2); strategies with a model per client keep a ``ModelStore`` in ``matrix``.
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
