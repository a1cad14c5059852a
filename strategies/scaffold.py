"""SCAFFOLD -- Karimireddy et al., ICML 2020, Algorithm 1 (server side).

    send (x, c) to the sampled clients S
    x <- x + eta_g * mean_{i in S} (y_i - x)          (line 16)
    c <- c + |S|/N * mean_{i in S} (c_i+ - c_i)       (line 17)

Each client uploads its model y_i and the number K_i of local steps it took; with option
II, c_i+ - c_i = -c + (x - y_i) / (K_i eta_l), which the server computes itself from y_i
(the same value the client adds to its own c_i) -- so the upload is just a model and
passes the base's shape checks.  c starts at zero and travels in the fit config (bytes);
c_i lives in each client's context.state.

Choices: the model mean is weighted by sample count like FedAvg (the paper's plain mean
when clients hold equal amounts of data), so with zero control variates and eta_g = 1 a
round is exactly a FedAvg round (tested); the control mean is the paper's plain mean.
Personalized evaluation is the global model (SCAFFOLD is not a pFL method; it is
FedAMP's global baseline).
"""

from __future__ import annotations

import numpy as np

from flower_pfl.baselines_math import arrays_to_bytes, scaffold_control_delta, scaffold_server
from strategies.base import PersonalizedStrategy


class Scaffold(PersonalizedStrategy):
    def setup(self, initial_arrays):
        self.control = [np.zeros_like(a) for a in initial_arrays]  # c = 0

    def fit_payload(self, pid, server_round):
        return list(self.global_arrays), {"control": arrays_to_bytes(self.control)}

    def aggregate_updates(self, server_round, updates):
        lr = float(self.cfg["train.lr"])
        dcs = [scaffold_control_delta(self.control, self.global_arrays, u.arrays,
                                      int(u.metrics["local_steps"]), lr) for u in updates]
        self.global_arrays, self.control = scaffold_server(
            self.global_arrays, self.control, [u.arrays for u in updates], dcs,
            [u.num_examples for u in updates], self.num_clients, float(self.hyper["global-lr"]))
        self.log_server(control_norm=float(np.sqrt(sum((c.astype(np.float64) ** 2).sum()
                                                       for c in self.control))))
