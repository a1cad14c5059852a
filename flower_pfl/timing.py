"""Which functions the opt-in phase timer (:mod:`flower_pfl.phases`) wraps, and as what.

Client (one record per message, kind = the message type): the ClientApp call as a Flower
mod (its own time: Flower's Message <-> NumPyClient conversion, arrays decoded and encoded,
``client_fn``), our client's construction, run-config parse, data access, the rest of
``setup``, model build + weight load, training steps, prox centre, evaluation, model ->
numpy, personal state in ``context.state``, and the rest of ``fit``/``evaluate`` (metrics).

Server (one record per fit step and per evaluate step of a round): Flower's
``Server.fit_round`` / ``evaluate_round`` (own time: sending, polling for the replies),
the strategy's configure / aggregate steps, the round's CSV, summary.json and TensorBoard
writes.  Nothing is wrapped unless ``FLOWER_PFL_PHASES`` is set.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable

from flower_pfl import phases

if TYPE_CHECKING:
    from flwr.app import Context, Message
    from flwr.clientapp.typing import ClientAppCallable


def _round(msg: Any) -> int:
    """The server round a message belongs to: the ``round`` our strategies put in every
    message's configuration (0 for the handshake, which has none)."""
    for record in msg.content.config_records.values():
        if "round" in record:
            return int(record["round"])
    return 0


def message_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """A ClientApp mod that only passes the message on (its wrapper times the call)."""
    return call_next(msg, context)


def client_mods(dispatcher: type) -> list[Callable[..., Any]]:
    """``[timed message_mod]`` when the timer is on (after wrapping the client phases;
    ``dispatcher``: the ClientApp's NumPyClient, whose ``_client`` builds our client),
    else ``[]`` -- the ClientApp then runs without any mod."""
    return install_client(dispatcher)[1]


def install_client(dispatcher: type) -> tuple[phases.Recorder | None, list[Callable[..., Any]]]:
    """(the recorder, the mods) of :func:`client_mods`; (None, []) when the timer is off."""
    if phases.folder() is None:
        return None, []
    from flower_pfl.clients import base, fedamp, fedavg, fedprox, state

    this = sys.modules[__name__]
    targets = [
        (this, "message_mod", "flower: Message <-> NumPyClient, client_fn",
         lambda msg, *_: {"kind": str(msg.metadata.message_type),
                          "round": _round(msg)}),
        (dispatcher, "_client", "ours: client construction"),
        (base, "parse_run_config", "ours: run config parse"),
        (base, "load_client_data", "ours: data access"),
        (base.PFLClient, "setup", "ours: setup (state dir, device, spec)"),
        (base.PFLClient, "new_model", "ours: model build + weight load"),
        (base.PFLClient, "local_train", "training steps"),
        (base.PFLClient, "test", "evaluation"),
        (base, "get_arrays", "ours: model -> numpy"),
        (fedavg, "get_arrays", "ours: model -> numpy"),
        (fedprox.FedProxClient, "regularizer", "ours: prox centre"),
        (fedamp.FedAMPClient, "regularizer", "ours: prox centre"),
        *[(state.ClientState, name, "ours: personal state (context.state)")
          for name in ("get_arrays", "set_arrays", "get_values", "set_values", "resolve")],
        (base.PFLClient, "fit", "ours: fit/evaluate rest (metrics, device report)"),
        (base.PFLClient, "evaluate", "ours: fit/evaluate rest (metrics, device report)"),
    ]
    rec = phases.install("client", targets)
    return rec, [this.message_mod]


def install_server() -> phases.Recorder | None:
    """Wrap the server's phases when the timer is on (the recorder; None when off)."""
    if phases.folder() is None:
        return None
    from flwr.server import Server

    from flower_pfl.reporting import results, tracking
    from flower_pfl.strategies import base, evaluation

    strategy = base.PersonalizedStrategy
    return phases.install("server", [
        (Server, "fit_round", "flower: send, poll for replies (fit)",
         lambda *_, **kw: {"kind": "fit", "round": kw.get("server_round")}),
        (Server, "evaluate_round", "flower: send, poll for replies (evaluate)",
         lambda *_, **kw: {"kind": "evaluate", "round": kw.get("server_round")}),
        (strategy, "configure_fit", "ours: configure_fit"),
        (strategy, "aggregate_fit", "ours: aggregate_fit (checks, aggregation)"),
        (evaluation.EvaluationReporting, "configure_evaluate", "ours: configure_evaluate"),
        (evaluation.EvaluationReporting, "aggregate_evaluate",
         "ours: aggregate_evaluate (statistics, console)"),
        (results, "append_csv", "ours: CSV writes"),
        (results.ResultsWriter, "write_summary", "ours: summary.json"),
        (tracking.TensorBoardTracker, "round", "ours: TensorBoard"),
        (tracking.TensorBoardTracker, "fit", "ours: TensorBoard"),
        (tracking.TensorBoardTracker, "server", "ours: TensorBoard"),
    ])
