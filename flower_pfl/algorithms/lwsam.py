"""PLGU's local optimizer step: SAM / LWSAM (PLGU Algorithm 1, eqs. 4-5, p = q = 2).

Gradient g at theta, ascent eps = rho * Lambda g / ||Lambda g|| on the ``perturbed`` tensors
(||eps|| = rho; the norm over the perturbed tensors -- eq. 5's printed ||g||^2 is replaced,
docs/algorithms/plgu.md; the perturbation is
:func:`flower_pfl.algorithms.plgu_math.lwsam_perturbation`), gradient g~ at theta + eps
(:func:`flower_pfl.algorithms.plgu_math.perturbed_gradient`), then
one optimizer step with g~ on the perturbed tensors and with the plain g on the ``plain``
tensors (Algorithm 1's personalized update, line 5).  The perturbed pass restores the
model's buffers: BatchNorm running statistics move once per step, with the unperturbed pass.
SAM (FedSAM) is Lambda = I, eps = rho g/||g||; rho = 0 is exactly one SGD step (no second
pass).  The loop over a client's mini-batches is
:func:`flower_pfl.learning.training.train_lwsam`.  Pure torch, no Flower import.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from flower_pfl.algorithms.plgu_math import lwsam_perturbation, perturbed_gradient


def lwsam_step(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor,
               opt: torch.optim.Optimizer, perturbed: Sequence[torch.Tensor],
               scales: Sequence[float], rho: float, plain: Sequence[torch.Tensor] = (),
               loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy
               ) -> float:
    """One SAM/LWSAM step on the batch (xb, yb); returns the loss at theta (before eps).

    ``perturbed``: tensors that get the ascent perturbation and the SAM gradient g~;
    ``scales``: Lambda of each of them (1.0 everywhere = SAM); ``plain``: tensors updated
    with the unperturbed gradient g; any other parameter of ``model`` stays fixed.
    ``opt`` must optimise exactly ``perturbed + plain``."""
    tensors = list(perturbed) + list(plain)
    loss = loss_fn(model(xb), yb)
    grads = torch.autograd.grad(loss, tensors)
    g_pert, g_plain = grads[:len(perturbed)], grads[len(perturbed):]
    if rho > 0 and perturbed:
        g_pert = perturbed_gradient(model, perturbed, lwsam_perturbation(g_pert, scales, rho),
                                    xb, yb, loss_fn)
    for p, g in zip(tensors, list(g_pert) + list(g_plain)):
        p.grad = g.detach()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())
