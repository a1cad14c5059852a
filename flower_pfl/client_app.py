"""Flower ClientApp: one NumPyClient per message, chosen by the strategy the server runs.

The server names its strategy in every message; the validated run configuration comes in
the run config (``context.run_config["cfg"]``, put there once by flower-pfl's launchers)
or, for a ServerApp started by ``flwr run`` with a YAML path, with every message, so a
SuperNode needs no copy of simulation.yaml.  ``client_fn`` returns a thin dispatcher that
instantiates the registered NumPyClient for that strategy.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.client import Client, NumPyClient  # legacy API: no current path in Flower 1.42
from flwr.clientapp import ClientApp
from flwr.common import NDArrays, Scalar  # (NumPyClient's own types, flwr.common only)

from flower_pfl import registry, timing
from flower_pfl.tuned import array_packing


class RegistryClient(NumPyClient):
    """Delegates each call to the registered client class of the server's strategy."""

    def __init__(self, context: Context) -> None:
        self.ctx = context

    def _client(self, config: dict[str, Scalar]) -> NumPyClient:
        name = config.get("strategy")
        if name is None:  # handshake: any client answers get_properties the same way
            from flower_pfl.clients.base import PFLClient

            return PFLClient(self.ctx)
        return registry.client_class(str(name))(self.ctx)

    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        return self._client(config).get_properties(config)

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]
            ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        return self._client(config).fit(parameters, config)

    def evaluate(self, parameters: NDArrays, config: dict[str, Scalar]
                 ) -> tuple[float, int, dict[str, Scalar]]:
        return self._client(config).evaluate(parameters, config)


def client_fn(context: Context) -> Client:
    return RegistryClient(context).to_client()


#: the arrays a tuned deployment's ServerApp packed, unpacked first (and the reply packed
#: back); then the phase timer's mod when it is on
app = ClientApp(client_fn=client_fn,
                mods=[array_packing.client_mod, *timing.client_mods(RegistryClient)])
