"""The synthetic federation the server benchmarks drive a Strategy with, without clients.

benchmarks/server_cost.py and benchmarks/store_scale.py call a Strategy's own Flower methods
(``initialize_parameters``, ``configure_fit``, ``aggregate_fit``) on:

- a synthetic MLP-shaped model (:data:`SHAPES`: 784x1024, 1024, 1024x200, 200, 200x10, 10
  = 1,010,850 floats), so that layer-wise strategies (PLGU, FedRep) see layers;
- a client manager of n fake proxies (:func:`make_manager`) that answer only the handshake
  (their partition-id);
- :func:`synthetic_uploads`: every sampled client's FitRes -- what it was sent (or, where
  the strategy's clients upload another shape, e.g. FedRep's body, the strategy's upload
  template) plus client-specific Gaussian noise (std 0.01, float32), metrics
  ``partition-id``/``num-train``/``train_loss``/``local_steps``/``sigma_sq``.

:func:`timed_rounds` runs the rounds and times ``configure_fit`` and ``aggregate_fit``
apart, the clients' side (the uploads) outside the clock.  The instructions stay alive
until ``aggregate_fit`` returns, as in Flower's ``fit_round``, so a peak RSS holds the
round's payloads and uploads as a real server's does; both are dropped before the next
round.  A strategy that needs uploads of yet another shape (e.g. control variates) fails
in ``aggregate_fit``; the benchmarks report it as not measured.
"""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np

SHAPES = [(784, 1024), (1024,), (1024, 200), (200,), (200, 10), (10,)]


def model_arrays(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(0.05 * rng.standard_normal(s)).astype(np.float32) for s in SHAPES]


class FakeProxy:
    """Answers the handshake with its partition-id; nothing else is ever called."""

    def __init__(self, cid: str, pid: int) -> None:
        from flwr.common import Code, GetPropertiesRes, Status

        self.cid, self.node_id = cid, int(cid)
        self._res = GetPropertiesRes(Status(Code.OK, ""), {"partition-id": pid})

    def get_properties(self, ins, timeout, group_id):
        return self._res


def make_manager(n: int):
    """A SimpleClientManager holding n fake proxies, partition-ids 0..n-1."""
    from flwr.server.client_manager import SimpleClientManager
    from flwr.server.client_proxy import ClientProxy

    class Proxy(FakeProxy, ClientProxy):
        def __init__(self, cid, pid):
            ClientProxy.__init__(self, cid)
            FakeProxy.__init__(self, cid, pid)

        def get_parameters(self, *a):
            raise NotImplementedError

        def fit(self, *a):
            raise NotImplementedError

        def evaluate(self, *a):
            raise NotImplementedError

        def reconnect(self, *a):
            raise NotImplementedError

    manager = SimpleClientManager()
    for pid in range(n):
        manager.register(Proxy(str(1000 + pid), pid))
    return manager


def synthetic_uploads(instructions, template: list[np.ndarray],
                      rng: np.random.Generator) -> list:
    """(proxy, FitRes) for every (proxy, FitIns) of ``configure_fit``: the arrays sent (or
    ``template`` where they are not of its shapes) plus float32 Gaussian noise, std 0.01."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

    shapes = [a.shape for a in template]
    results = []
    for proxy, ins in instructions:
        pid = int(proxy.get_properties(None, None, None).properties["partition-id"])
        sent = parameters_to_ndarrays(ins.parameters)
        base = sent if [a.shape for a in sent] == shapes else template
        up = [(a + 0.01 * rng.standard_normal(a.shape, dtype=np.float32)).astype(
            np.float32, copy=False) for a in base]
        results.append((proxy, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(up), 100,
                                      {"partition-id": pid, "num-train": 100, "train_loss": 1.0,
                                       "local_steps": 10, "sigma_sq": 0.01})))
        del sent, up  # only the serialised bytes stay (store_scale's peak RSS)
    return results


def timed_rounds(strategy, params, manager, rounds: int) -> Iterator[tuple[int, int, float,
                                                                            float]]:
    """Rounds 1..``rounds`` from ``params``: yields (round, clients sampled, configure_fit
    seconds, aggregate_fit seconds); the uploads are built outside the clock."""
    template = strategy.upload_template()  # FedRep/PLGU-GRep: the clients upload the body
    rng = np.random.default_rng(1)
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        instructions = strategy.configure_fit(rnd, params, manager)
        t_conf = time.perf_counter() - t0
        results = synthetic_uploads(instructions, template, rng)
        k = len(results)
        t0 = time.perf_counter()
        new, _ = strategy.aggregate_fit(rnd, results, [])
        t_agg = time.perf_counter() - t0
        del instructions, results
        if new is not None:
            params = new
        yield rnd, k, t_conf, t_agg
