"""pFedBreD_ns / pFedMe client -- Shi et al. (NeurIPS 2023), Algorithm 1 lines 5-10.

    line 5   w_{i,0} <- w^(t-1) (received),  theta_{i,0} <- theta_{i,R}^(t-1) (context.state;
             ``theta-init: carry``) or <- w^(t-1) (``restart``: pFedMe's rule)
    lines 6-10  for r = 1..R, one mini-batch each (two for mh-lookahead):
             mu     <- meta-step of eq. 14 (lg / meg / mh / mh-lookahead; pFedMe: mu = w)
             theta  <- K SGD steps (step alpha) on f_i(theta) + lambda/2 ||theta - mu||^2
             w      <- w - alpha_m lambda (mu - theta)   (eq. 13; ``envelope: w``: w - theta)
    upload   w_{i,R}

context.state (mirrored to the node's state-dir in deployment) keeps theta_{i,R} (key
``personal``: the personalized model, evaluated as P) and, for meg / mh, the memorized
w_{i,R} (key ``pfedbred-w``) that the next round's meta-step uses.  A client's first round
starts both from the received w^(t-1).  The math is flower_pfl/algorithms/pfedbred_math.py; the
hyper-parameters come from the strategy in the fit config.

A held-out newcomer (docs/newcomers.md; pFedMe): theta from the global w, the budget's SGD
steps of size alpha on the inner problem f_i(theta) + lambda/2 ||theta - w||^2 (mu = w).
"""

from __future__ import annotations

import torch
from flwr.common import NDArrays

from flower_pfl.algorithms import pfedbred_math as pm
from flower_pfl.algorithms.prox import Prox
from flower_pfl.catalog import pfedbred
from flower_pfl.catalog.pfedbred import PFedBreDFit, PFedBreDReply
from flower_pfl.clients.base import NEWCOMER_SALT, MessageConfig, Metrics, PersonalStateClient
from flower_pfl.learning.models import NamedLayers, get_arrays
from flower_pfl.learning.training import batches, params_of
from flower_pfl.registry import client_for

MEMORY_KEY = "pfedbred-w"


@client_for(pfedbred.PFEDBRED, pfedbred.PFEDBRED_LG, pfedbred.PFEDBRED_MEG, pfedbred.PFEDBRED_MH,
            pfedbred.PFEDBRED_MH_LOOKAHEAD, pfedbred.PFEDME)
class PFedBreDClient(PersonalStateClient):
    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        sent = PFedBreDFit.from_config(config)
        prior = sent.prior
        w = self.new_model(parameters)                                   # w_{i,0} = w^(t-1)
        carried = self.state.get_arrays("personal") if sent.theta_init == "carry" else None
        theta = self.new_model(carried or parameters)                    # theta_{i,0}
        memory = None
        if pm.uses_memory(prior):                                       # w_{i,R}^(t-1)
            mem = self.state.get_arrays(MEMORY_KEY) or parameters
            memory = [p.detach().clone() for p in self.new_model(mem).parameters()]
        x, y = self.data.x_train, self.data.y_train
        order = batches(len(y), sent.batch_size,
                        sent.local_iterations * pm.batches_per_iteration(prior),
                        self.generator(), self.spec.drop_last)
        data = ((x[idx].to(self.device), y[idx].to(self.device)) for idx in order)
        loss_fn = self.loss_fn()
        stats = pm.local_round(
            w, theta, memory, data, prior=prior, lam=sent.lam, alpha=sent.alpha,
            alpha_m=sent.alpha_m, prox_iters=sent.prox_steps, eta=sent.eta,
            eta_alpha=sent.eta_alpha, loss_fn=loss_fn, envelope=sent.envelope)
        w_arrays = get_arrays(w)
        self.save_personal(theta)                                        # theta_{i,R}
        if memory is not None:
            self.state.set_arrays(MEMORY_KEY, w_arrays)
        with torch.no_grad():
            gap = sum(float(((a - b) ** 2).sum()) for a, b in
                      zip(w.parameters(), theta.parameters())) ** 0.5
        return w_arrays, {**stats, **PFedBreDReply(w_theta_gap=gap).to_config()}

    def adapt_newcomer(self, model: NamedLayers, config: MessageConfig, steps: int
                       ) -> NamedLayers:
        """pFedMe's inner problem for a newcomer: ``steps`` SGD steps of size alpha on
        f_i(theta) + lambda/2 ||theta - w||^2 from theta = w (``model``, the global w; mu =
        w: pFedMe's prior), lambda and alpha from the instruction's :class:`PFedBreDFit`."""
        sent = PFedBreDFit.from_config(config)
        center = params_of(self.new_model(get_arrays(model)))  # w, fixed
        self.local_train(model, regularizer=Prox(center, sent.lam), num_steps=steps,
                         salt=NEWCOMER_SALT, lr=sent.alpha)
        return model
