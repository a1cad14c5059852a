"""FedAMP / HeurFedAMP client -- eq. 6 of Huang et al. (AAAI 2021).

    w_i = argmin_w F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2

approximated by the configured local SGD steps started from the personalized cloud
model u_i.  The prox term is a ``prox.Prox``: its gradient (lambda/alpha_k)(w - u_i)
is added to the data loss's gradient before each SGD step, bit for bit what autograd
gives for the squared term (tests/test_fedamp.py, tests/test_prox_fused.py).  w_i is kept
in context.state as the client's personalized model and uploaded.
"""

from __future__ import annotations

from flower_pfl.algorithms.prox import Prox
from flower_pfl.catalog import fedamp
from flower_pfl.catalog.fedamp import FedAMPFit
from flower_pfl.clients.base import MessageConfig, PersonalStateClient
from flower_pfl.learning.models import NamedLayers
from flower_pfl.learning.training import params_of
from flower_pfl.registry import client_for


@client_for(fedamp.FEDAMP, fedamp.HEURFEDAMP)
class FedAMPClient(PersonalStateClient):
    def regularizer(self, model: NamedLayers, config: MessageConfig) -> Prox:
        center = params_of(model)  # u_i (training starts there), detached: it does not move
        coef = FedAMPFit.from_config(config).prox_coef  # lambda / alpha_k, from the server
        return Prox(center, coef)
