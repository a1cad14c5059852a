"""SCAFFOLD client -- Karimireddy et al., ICML 2020, Algorithm 1, lines 7-13.

    y <- x;  K times:  y <- y - eta_l (g_i(y) + c - c_i)      (corrected SGD step)
    c_i+ = c_i - c + (x - y) / (K eta_l)                       (option II)
    upload y and dc_i = c_i+ - c_i;  c_i <- c_i+ (kept in context.state)

The correction is a loss term <c - c_i, y> (``baselines_math.linear_term``) whose gradient
is exactly c - c_i, so the step is training.train's SGD on F_i + <c - c_i, y>.  K is the
number of mini-batch steps taken and eta_l the configured learning rate; option II
assumes plain SGD, so train.momentum must be 0 (refused at validation: the catalog entry's
``refuses``).  train.weight-decay is defined: it is the gradient of the L2 term of the local
objective F_i + wd/2 ||y||^2, so (x - y) / (K eta_l) is the mean gradient of that objective
and c_i, c estimate it (docs/training.md).  The
control variates have the shapes of the transported model arrays, which are the
trainable parameters of the models used with SCAFFOLD (no float buffers; checked).
c arrives after the model (the download's extra part ``control``) and dc_i leaves after y
(the upload's extra part ``control-delta``, checked by the server like a model array); dc_i
is computed as -c + (x - y) / (K eta_l) (``scaffold_control_delta``), option II's c_i+ - c_i.
The personalized model is the global model.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.common import NDArrays

from flower_pfl.algorithms.baselines_math import (
    CONTROL,
    CONTROL_DELTA,
    linear_term,
    scaffold_client_control,
    scaffold_control_delta,
)
from flower_pfl.catalog import baselines
from flower_pfl.clients.base import MessageConfig, Metrics, PFLClient
from flower_pfl.learning.models import NamedLayers, get_arrays
from flower_pfl.registry import client_for
from flower_pfl.reliability.uploads import UploadTemplate


@client_for(baselines.SCAFFOLD)
class ScaffoldClient(PFLClient):
    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        parameters, extra = self.split_download(parameters, config)
        model = self.new_model(parameters)
        x = [np.asarray(a, dtype=np.float32) for a in parameters]
        if len(x) != len(list(model.parameters())):
            raise ValueError("SCAFFOLD needs a model whose transported arrays are its "
                             "parameters (no float buffers such as BatchNorm statistics)")
        c = extra.get(CONTROL) or [np.zeros_like(a) for a in x]
        c_i = self.state.get_arrays("scaffold-ci") or [np.zeros_like(a) for a in x]
        direction = [torch.as_tensor(cc - ci, device=self.device) for cc, ci in zip(c, c_i)]
        steps = self.spec.num_steps(self.data.num_train)
        metrics = self.local_train(model, regularizer=lambda m: linear_term(m, direction),
                                   num_steps=steps)
        y = get_arrays(model)
        c_plus = scaffold_client_control(c_i, c, x, y, steps, self.spec.lr)
        self.state.set_arrays("scaffold-ci", c_plus)
        metrics["ci_norm"] = float(np.sqrt(sum(float((a.astype(np.float64) ** 2).sum())
                                               for a in c_plus)))
        dc = scaffold_control_delta(c, x, y, steps, self.spec.lr)
        return UploadTemplate(y, {CONTROL_DELTA: dc}).arrays, metrics

    def personal_model(self, parameters: NDArrays, config: MessageConfig
                       ) -> NamedLayers:
        return self.new_model(parameters)
