"""The spike's ClientApp on Flower's Message API (``@app.query``, ``@app.train``,
``@app.evaluate``).

Each handler reads the instruction (:func:`.records.read_instruction`: an ``ArrayRecord``
and a ``ConfigRecord``), builds the client class registered for the strategy the message
names (the same classes the legacy ClientApp serves: ``clients/``), calls its ``fit`` /
``evaluate`` -- local training, personal state in ``context.state`` kept only for an
accepted round, evaluation on the client's own test split, all unchanged -- and answers
with :func:`.records.reply`.  ``query`` answers the server's handshake with the node's
``partition-id``.

Nothing here is per paper: what a client does is its class's; what travels is
:mod:`.records`'.  A client that raises answers with an error reply (Flower's ClientApp
wraps the exception), which the server records as that partition-id's failure.
"""

from __future__ import annotations

from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from flower_pfl import registry
from flower_pfl.instructions import RoundInstruction
from flower_pfl.message_api.records import HANDSHAKE, read_instruction, reply

app = ClientApp()


def _client(context: Context, config: dict[str, Any]) -> Any:
    """The registered client of the strategy named in ``config`` (legacy ``NumPyClient``
    subclass: its ``fit`` / ``evaluate`` are called directly, no legacy message)."""
    name = RoundInstruction.from_config(config).strategy
    if not name:
        raise ValueError("the message's config names no 'strategy': this ClientApp serves "
                         "flower_pfl.message_api.server_app strategies only")
    return registry.client_class(name)(context)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """The handshake: this node's ``partition-id`` (its node config)."""
    if HANDSHAKE not in context.node_config:
        raise RuntimeError("this node has no 'partition-id' in its node config")
    pid = int(context.node_config[HANDSHAKE])
    return Message(RecordDict({"info": ConfigRecord({HANDSHAKE: pid})}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training (the strategy's client ``fit``): uploads its arrays."""
    arrays, config = read_instruction(msg.content)
    out, num_examples, metrics = _client(context, config).fit(arrays, config)
    return Message(reply(out, num_examples, metrics), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The client's personalized evaluation (its client ``evaluate``): no arrays back."""
    arrays, config = read_instruction(msg.content)
    loss, num_examples, metrics = _client(context, config).evaluate(arrays, config)
    return Message(reply([], num_examples, metrics, loss=loss), reply_to=msg)
