"""FedAMP / HeurFedAMP client -- eq. 6 of Huang et al. (AAAI 2021).

    w_i = argmin_w F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2

approximated by the configured local SGD steps started from the personalized cloud
model u_i.  The prox term is squared and differentiated with the data loss (its
gradient is (lambda/alpha_k)(w - u_i); tests/test_fedamp.py checks it).  w_i is kept in
context.state as the client's personalized model and uploaded.
"""

from __future__ import annotations

from clients.base import PersonalStateClient
from flower_pfl.training import params_of, prox_penalty


class FedAMPClient(PersonalStateClient):
    def regularizer(self, model, config):
        center = params_of(model)  # u_i (training starts there), detached: it does not move
        coef = float(config["prox-coef"])  # lambda / alpha_k, from the server
        return lambda m: prox_penalty(m, center, coef)
