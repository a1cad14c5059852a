"""Self-FL -- Chen et al., "Self-Aware Personalized Federated Learning", Algorithm 1.

Per round t (clients: clients/selffl.py):
  server -> client m: theta^{t-1}, sigma_0^2 and S_{-m} = sum_{k != m} (sigma_0^2 + sigma_k^2)^-1
  client m: sigma_m^2 by eq. 13 (online, trace of the variance of its personal parameters
            across rounds); theta_m^INIT by eq. 10; l_m local steps by eq. 8 clipped to
            [1, l_max]; trains; returns theta_m^t and sigma_m^2
  server:   sigma_0^2 by eq. 14 (trace of the variance of the received models);
            theta_hat^t by eq. 11 over the active clients (weights (sigma_0^2+sigma_m^2)^-1);
            theta^t = (1 - C) theta^{t-1} + C theta_hat^t with C = fraction-fit (section 4.1).
Optional FedAvg warm-start rounds (section 3.2).  ``oracle: true`` (synthetic task only)
replaces the estimates by the true sigma_0^2 and sigma_m^2 = noise^2 / N_m.
Guards and fallbacks for every division/log: flower_pfl/selffl_math.py.
"""

from __future__ import annotations

import math

import numpy as np

from flower_pfl import selffl_math as sm
from strategies.base import ClientUpdate, PersonalizedStrategy
from strategies.fedavg import weighted_average

UNKNOWN = -1.0  # config values cannot be None: negative variance = not known yet


class SelfFL(PersonalizedStrategy):
    def setup(self, initial_arrays):
        self.sigma0_sq = math.nan
        self.oracle_sigma_sq = None
        if self.hyper["oracle"]:
            from flower_pfl.data import gaussian_truth

            truth = gaussian_truth(self.cfg.values)
            self.sigma0_sq = truth.sigma0_sq
            self.oracle_sigma_sq = truth.sigma_sq
            for pid, value in enumerate(truth.sigma_sq):
                self.store.put("sigma_sq", pid, float(value))

    def warmup(self, server_round: int) -> bool:
        return server_round <= self.hyper["warmup-rounds"]

    def s_minus(self, pid: int) -> float:
        others = [v for k, v in self.store.values.get("sigma_sq", {}).items() if k != pid]
        if not math.isfinite(self.sigma0_sq) or not others:
            return math.nan
        return sm.s_minus(self.sigma0_sq, others)

    def fit_payload(self, pid, server_round):
        s = self.s_minus(pid)
        return self.global_arrays, {
            "warmup": self.warmup(server_round),
            "sigma0-sq": self.sigma0_sq if math.isfinite(self.sigma0_sq) else UNKNOWN,
            "s-minus": s if math.isfinite(s) else UNKNOWN,
            "eta": float(self.cfg["train.lr"] if self.hyper["eta"] == "auto" else self.hyper["eta"]),
            "l-max": int(self.hyper["l-max"]),
            "oracle-sigma-sq": float(self.oracle_sigma_sq[pid]) if self.oracle_sigma_sq is not None
            else UNKNOWN,
        }

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        models = np.stack([self.spec.flatten(u.arrays) for u in updates]).astype(np.float64)
        sigma_sq = np.array([float(u.metrics["sigma_sq"]) for u in updates])
        sigma_sq[sigma_sq < 0] = np.nan
        for u, value in zip(updates, sigma_sq):
            if np.isfinite(value):
                self.store.put("sigma_sq", u.pid, float(value))
        previous = self.spec.flatten(self.global_arrays).astype(np.float64)
        if self.warmup(server_round):
            theta = self.spec.flatten(weighted_average([u.arrays for u in updates],
                                                       [u.num_examples for u in updates]))
        else:
            if not self.hyper["oracle"]:
                estimate = sm.variance_across(models)  # eq. 14
                if np.isfinite(estimate):
                    self.sigma0_sq = estimate
            theta_hat = sm.aggregate(models, self.sigma0_sq if math.isfinite(self.sigma0_sq)
                                     else 0.0, sigma_sq)  # eq. 11
            theta = sm.smooth(previous, theta_hat, float(self.cfg["fraction-fit"]))
        self.global_arrays = self.spec.unflatten(np.asarray(theta, dtype=np.float32))
        steps = [float(u.metrics.get("local_steps", 0)) for u in updates]
        known = sigma_sq[np.isfinite(sigma_sq)]
        self.log_server(sigma0_sq=self.sigma0_sq,
                        sigma_m_sq_min=float(known.min()) if known.size else math.nan,
                        sigma_m_sq_median=float(np.median(known)) if known.size else math.nan,
                        sigma_m_sq_max=float(known.max()) if known.size else math.nan,
                        local_steps_min=min(steps), local_steps_mean=float(np.mean(steps)),
                        local_steps_max=max(steps), warmup=self.warmup(server_round))
