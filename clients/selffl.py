"""Self-FL client -- Chen et al., Algorithm 1 (client side).

Keeps in context.state its personal parameters theta_m^{t-1} and the Welford moments of
its personal parameters across rounds (eq. 13).  Each round: theta_m^INIT by eq. 10 from
the global model, its previous personal model and the server's sigma_0^2 and S_{-m};
l_m local steps by eq. 8 (clipped to [1, l_max]) of SGD with step eta; the result is its
new personal model.  Returns theta_m^t and sigma_m^2.
"""

from __future__ import annotations

import math

import numpy as np

from clients.base import PersonalStateClient
from flower_pfl import selffl_math as sm
from flower_pfl.models import get_arrays
from flower_pfl.params import ParamSpec


def _known(value) -> float:
    value = float(value)
    return value if value >= 0 else math.nan


class SelfFLClient(PersonalStateClient):
    def load_moments(self) -> sm.Welford:
        meta = self.state.get_values("selffl") or {"count": 0}
        arrays = self.state.get_arrays("selffl-moments")
        if arrays is None:
            return sm.Welford()
        return sm.Welford(int(meta["count"]), arrays[0].astype(np.float64),
                          arrays[1].astype(np.float64))

    def save_moments(self, moments: sm.Welford) -> None:
        self.state.set_values("selffl", {"count": moments.count})
        self.state.set_arrays("selffl-moments", [moments.mean, moments.m2])

    def fit_round(self, parameters, config):
        spec = ParamSpec.of(parameters)
        theta_global = spec.flatten(parameters).astype(np.float64)
        personal = self.state.get_arrays("personal")
        theta_prev = theta_global if personal is None else spec.flatten(personal).astype(np.float64)
        moments = self.load_moments()
        default_steps = self.spec.num_steps(self.data.num_train)
        oracle = _known(config["oracle-sigma-sq"])
        sigma_m_sq = oracle if math.isfinite(oracle) else moments.variance  # eq. 13
        if config["warmup"]:
            coef, steps, why, eta = 0.0, default_steps, "warm-up (FedAvg)", None
        else:
            sigma0_sq, s_minus = _known(config["sigma0-sq"]), _known(config["s-minus"])
            coef = sm.init_coefficient(sigma0_sq, sigma_m_sq, s_minus)
            eta = float(config["eta"])
            steps, why = sm.local_steps(eta, sigma_m_sq, s_minus, int(config["l-max"]),
                                        default_steps)
        init = sm.init_params(theta_global, theta_prev, coef)  # eq. 10 (coef 0: global model)
        model = self.new_model(spec.unflatten(init.astype(np.float32)))
        metrics = self.local_train(model, num_steps=steps, lr=eta)
        theta_new = get_arrays(model)
        moments.add(spec.flatten(theta_new))
        self.save_moments(moments)
        self.save_personal(model)
        reported = oracle if math.isfinite(oracle) else moments.variance
        return theta_new, {**metrics, "sigma_sq": reported if math.isfinite(reported) else -1.0,
                           "local_steps": float(steps), "init_coef": float(coef),
                           "steps_rule": why}
