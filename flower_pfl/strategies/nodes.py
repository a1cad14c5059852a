"""Who is in the federation: nodes mapped to partition-ids, and the round's sample.

A mixin of ``PersonalizedStrategy`` (it uses ``self.cfg``, ``self.cfg_json``,
``self.num_clients``, ``self.rng``, ``self.pid_of_cid``, ``self.proxies`` and
``self._federation_checked``, all set in its ``__init__``):

* :meth:`NodeTracking.handshake` learns each node's ``partition-id`` with a
  ``get_properties`` handshake (asked once per node id) so that all per-client state is
  keyed by it, never by Flower's random node id; at the start the federation must have
  exactly ``clients`` nodes (one source of truth with ``simulation.yaml``), later a node
  that is gone is not an error and a node that comes back is mapped again;
* :meth:`NodeTracking.sample` picks ``max(min-fit-clients, round(fraction-fit *
  participants))`` of the connected partition-ids that are not held-out newcomers
  (flower_pfl/newcomers.py) with the strategy's own seeded generator (reproducible
  sampling, independent of node ids);
* :meth:`NodeTracking.proxy_pid` names the partition-id behind a proxy.
"""

from __future__ import annotations

import concurrent.futures
from logging import INFO, WARNING

import numpy as np
from flwr.common import GetPropertiesIns, GetPropertiesRes
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from flower_pfl.strategies.federation import FederationError, TaggedProxy, failure_reason
from flower_pfl.strategies.state import StrategyState

#: how long the first handshake waits for the federation's nodes (and each node's answer),
#: plus :data:`PER_NODE_WAIT_S` per node (:func:`handshake_wait_s`)
WAIT_FOR_NODES_S = 120.0
#: the handshake's wait per node of the federation: Flower's simulation engine creates one
#: context per node before it delivers any message (~1 ms a node on a 2-core machine, ~90 s
#: at 100,000) and each handshake message then costs ~4-6 ms; 10 ms a node covers both
PER_NODE_WAIT_S = 0.01


def handshake_wait_s(num_nodes: int) -> float:
    """Seconds the first handshake waits for ``num_nodes`` nodes, and the lifetime of each
    handshake message: ``WAIT_FOR_NODES_S + PER_NODE_WAIT_S x num_nodes`` (120.2 s for 20
    nodes, 220 s for 10,000, 1,120 s for 100,000), so a message sent while the engine is
    still starting a large federation does not expire before it is delivered."""
    return WAIT_FOR_NODES_S + PER_NODE_WAIT_S * int(num_nodes)

#: most messages in flight at once (one waiting thread each; see :func:`message_threads`)
MAX_MESSAGE_THREADS = 256


def message_threads(num_messages: int) -> int:
    """Threads that send ``num_messages`` messages through Flower's legacy proxies: one per
    message (up to :data:`MAX_MESSAGE_THREADS`), so they are all in flight at once.  A
    legacy proxy's call blocks its thread until the reply, which it looks for every
    ``InMemoryGrid.pull_interval`` in simulation, and the simulation engine picks new
    messages up every 0.1 s (``vce_api.add_messages_to_queue``): with Flower's default pool
    (cores + 4, 6 threads on 2 cores) the ClientApp actors wait ~0.1-0.2 s between a reply
    and the next message instead of working through a queue.  Used for the rounds
    (``server_app``) and for the partition-id handshake with every node."""
    return max(1, min(int(num_messages), MAX_MESSAGE_THREADS))


class NodeTracking(StrategyState):
    """Partition-ids of the connected nodes, and the seeded sample of each round."""

    def sample(self, server_round: int) -> list[int]:
        """Partition-ids of this round's clients (seeded; independent of node ids): never a
        held-out newcomer (flower_pfl/newcomers.py), ``fraction-fit`` of the participants."""
        held_out = set(self.newcomers)
        available = sorted(p for p in self.proxies if p not in held_out)
        k = max(int(self.cfg["min-fit-clients"]), int(round(self.cfg["fraction-fit"] *
                                                            (self.num_clients - len(held_out)))))
        k = min(k, len(available))
        return sorted(self.sample_rng().choice(available, size=k, replace=False).tolist())

    def sample_rng(self) -> np.random.Generator:
        """The generator of the client sample: the strategy's seeded one, or under
        client-level DP its noise's generator (operating-system entropy), so that the
        sample cannot be re-drawn from the run's seed in config.json: amplification by
        subsampling assumes whoever gets the results does not know it (docs/privacy.md,
        "Who knows the sample")."""
        return self.dp.rng if self.dp is not None else self.rng

    def proxy_pid(self, proxy: ClientProxy) -> int:
        """The partition-id behind ``proxy`` (-1: a node that never answered the handshake)."""
        if isinstance(proxy, TaggedProxy):
            return proxy.pid
        return self.pid_of_cid.get(proxy.cid, -1)

    def handshake(self, client_manager: ClientManager) -> None:
        """Map every connected node to its partition-id (asked once per node).

        At the start the federation must have exactly ``clients`` nodes; later a missing
        node is logged, not fatal (its rounds are failures), and a node that comes back
        (a new node id) is mapped to its partition-id again."""
        if not self._federation_checked:
            if client_manager.num_available() < self.num_clients:
                client_manager.wait_for(self.num_clients,
                                        timeout=int(handshake_wait_s(self.num_clients)))
        available = client_manager.all()
        if not self._federation_checked and len(available) != self.num_clients:
            raise FederationError(
                f"the configuration says clients = {self.num_clients} but the federation has "
                f"{len(available)} node(s). In simulation run through `flower-pfl run` (it sets "
                f"num-supernodes from the YAML) or pass --federation-config "
                f"'num-supernodes={self.num_clients}'; in deployment start one SuperNode per "
                f"client.")
        unknown = [p for cid, p in available.items() if cid not in self.pid_of_cid]
        if unknown:
            ins = GetPropertiesIns({})  # a client answers its partition-id, nothing else
            wait = handshake_wait_s(self.num_clients)

            def ask(proxy: ClientProxy) -> GetPropertiesRes | None:
                try:
                    return proxy.get_properties(ins, wait, None)
                except Exception as exc:  # noqa: BLE001 - any failure = no handshake answer
                    if not self._federation_checked:
                        raise FederationError(f"node {proxy.cid} did not answer the partition-id "
                                              f"handshake: {failure_reason(exc)}") from exc
                    log(WARNING, "[flower-pfl] node %s did not answer the handshake (%s); "
                        "asking again next round", proxy.cid, failure_reason(exc))
                    return None
            with concurrent.futures.ThreadPoolExecutor(
                    max_workers=message_threads(len(unknown))) as pool:
                answers = list(pool.map(ask, unknown))
            for proxy, res in zip(unknown, answers):
                if res is None:
                    continue
                if "partition-id" not in res.properties:
                    raise FederationError(f"node {proxy.cid} did not report a partition-id "
                                          f"(status: {res.status.message})")
                pid = int(res.properties["partition-id"])
                if not 0 <= pid < self.num_clients:
                    raise FederationError(f"node {proxy.cid} reports partition-id {pid}, outside "
                                          f"[0, {self.num_clients}) of the configuration")
                if pid in self.proxies and self.proxies[pid].cid in available \
                        and self.proxies[pid].cid != proxy.cid:
                    raise FederationError(f"two nodes report partition-id {pid}")
                if self._federation_checked and pid not in self.proxies:
                    log(INFO, "[flower-pfl] partition-id %d is back (node %s)", pid, proxy.cid)
                self.pid_of_cid[proxy.cid] = pid
                self.proxies[pid] = proxy
        # a node that comes back under a node id already mapped (node authentication keeps
        # the id across restarts) needs no handshake: take its current proxy again
        for cid, proxy in available.items():
            pid = self.pid_of_cid.get(cid)
            if pid is not None and (pid not in self.proxies
                                    or self.proxies[pid].cid not in available):
                if self._federation_checked and pid not in self.proxies:
                    log(INFO, "[flower-pfl] partition-id %d is back (node %s)", pid, cid)
                self.proxies[pid] = proxy
        # drop proxies of nodes that disconnected (a restarted SuperNode gets a new proxy)
        gone = sorted(pid for pid, p in self.proxies.items() if p.cid not in available)
        if gone:
            log(WARNING, "[flower-pfl] partition-id(s) %s disconnected; the run goes on with "
                "%d node(s)", gone, len(self.proxies) - len(gone))
        self.proxies = {pid: p for pid, p in self.proxies.items() if p.cid in available}
        self._federation_checked = True
