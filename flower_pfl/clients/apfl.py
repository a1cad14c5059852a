"""APFL client -- Deng, Kamani & Mahdavi 2020, "Adaptive Personalized Federated
Learning", Algorithm 1 (client side).

State kept in context.state across rounds: the local model v_i and the mixing weight
alpha_i.  Each round, from the global model w (received), for every local mini-batch xi:
    w     <- w - eta grad f_i(w; xi)
    v_i   <- v_i - eta grad_v f_i(vbar_i; xi),     vbar_i = alpha_i v_i + (1 - alpha_i) w
    alpha <- alpha - eta_alpha grad_alpha f_i(vbar_i; xi)
(``baselines_math.apfl_step``: the gradients flow through the mixture); w is uploaded.
Personalized model: vbar_i = alpha_i v_i + (1 - alpha_i) w with the global model w the
server sends for evaluation (a client that never trained evaluates that w).

Choices: v_i starts at the first global model received; eta = train.lr; eta_alpha =
``alpha-lr``; alpha_i is clipped to [0, 1].

A held-out newcomer (docs/newcomers.md): v from the global w*, alpha from ``alpha-init``,
both learned through the mixture for the budget's steps against w* held fixed (w is
reset to w* after each step: the newcomer trains no global model); alpha v + (1 - alpha) w*
is evaluated.
"""

from __future__ import annotations

import torch
from flwr.common import NDArrays
from torch.nn import functional as F

from flower_pfl.algorithms.baselines_math import apfl_step, mixture
from flower_pfl.catalog import baselines
from flower_pfl.catalog.baselines import APFLInstruction
from flower_pfl.clients.base import NEWCOMER_SALT, MessageConfig, Metrics, PFLClient
from flower_pfl.learning.models import NamedLayers, get_arrays, set_arrays
from flower_pfl.learning.training import batches
from flower_pfl.registry import client_for


@client_for(baselines.APFL)
class APFLClient(PFLClient):
    def load_alpha(self, config: MessageConfig) -> float:
        values = self.state.get_values("apfl")
        return float(values["alpha"]) if values else APFLInstruction.from_config(config).alpha_init

    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        w = self.new_model(parameters).train()
        v = self.load_personal("apfl-v")
        v = (v if v is not None else self.new_model(parameters)).train()
        alpha = self.load_alpha(config)
        sent = APFLInstruction.from_config(config)
        steps = self.spec.num_steps(self.data.num_train)
        x, y = self.data.x_train, self.data.y_train
        loss_w = loss_mix = 0.0
        for idx in batches(len(y), self.spec.batch_size, steps, self.generator(),
                           self.spec.drop_last):
            xb, yb = x[idx].to(self.device), y[idx].to(self.device)
            alpha, lw, lm = apfl_step(w, v, alpha, xb, yb, self.spec.lr,
                                      sent.alpha_lr, F.cross_entropy,
                                      adapt_alpha=sent.adapt_alpha)
            loss_w, loss_mix = loss_w + lw, loss_mix + lm
        self.save_personal(v, "apfl-v")
        self.state.set_values("apfl", {"alpha": alpha})
        return get_arrays(w), {"train_loss": loss_w / steps, "mixture_loss": loss_mix / steps,
                               "alpha": alpha, "local_steps": float(steps)}

    def personal_model(self, parameters: NDArrays, config: MessageConfig
                       ) -> NamedLayers:
        w = self.new_model(parameters)
        v = self.load_personal("apfl-v")
        if v is None:
            return w
        alpha = torch.tensor(self.load_alpha(config))
        with torch.no_grad():
            for p, mixed in zip(w.parameters(), mixture(list(v.parameters()),
                                                        list(w.parameters()), alpha)):
                p.copy_(mixed)
        return w

    def adapt_newcomer(self, model: NamedLayers, config: MessageConfig, steps: int
                       ) -> NamedLayers:
        """APFL's v and alpha for a newcomer, learned against the fixed global w* (``model``):
        ``steps`` APFL steps (``apfl_step``) from v = w*, alpha = alpha-init, w put back
        to w* after each; returns alpha v + (1 - alpha) w*."""
        sent = APFLInstruction.from_config(config)
        w_star = get_arrays(model)
        w, v = self.new_model(w_star).train(), self.new_model(w_star).train()
        alpha = sent.alpha_init
        x, y = self.data.x_train, self.data.y_train
        for idx in batches(len(y), self.spec.batch_size, steps, self.generator(NEWCOMER_SALT),
                           self.spec.drop_last):
            alpha, _, _ = apfl_step(w, v, alpha, x[idx].to(self.device), y[idx].to(self.device),
                                    self.spec.lr, sent.alpha_lr, F.cross_entropy,
                                    adapt_alpha=sent.adapt_alpha)
            set_arrays(w, w_star)  # the global model stays w*
            self.eval_steps += 1
        with torch.no_grad():
            for p, mixed in zip(model.parameters(), mixture(list(v.parameters()),
                                                            list(w.parameters()),
                                                            torch.tensor(alpha))):
                p.copy_(mixed)
        return model
