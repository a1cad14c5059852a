"""The proximal term coef/2 * ||w - center||^2 of FedAMP (coef = lambda/alpha_k), FedProx
(mu), pFedMe/pFedBreD (lambda) and Ditto (lambda), as a fused gradient update.

The term is a :class:`Prox`: ``flower_pfl.learning.training.train`` differentiates the data
loss only and then adds the prox gradient ``coef * (w - center)`` to every parameter's
``.grad`` with three ``torch._foreach_*`` passes (:func:`add_prox_grad_`), before the
optimizer step.  That is the same floating-point work autograd does for
``prox_penalty`` (``0.5*coef*sum((w-c)**2)``): its backward is ``float32(0.5*coef) *
(2 * (w - c))``, which rounds exactly like ``float32(coef) * (w - c)`` (scaling by 2 is
exact; for coef = 1, FedProx's default mu, that is ``w - c`` itself and the multiply
pass is skipped), and the engine sums the data and prox contributions of a parameter in one
addition, which is commutative.  So the optimizer sees the same gradient bit for bit
(plain SGD, momentum and weight decay alike; tests/test_prox_fused.py) at about a
third of the cost (docs/BENCHMARKS.md).  Not fused on purpose:
``grad + coef*d`` as one ``add(alpha=coef)``/``addcmul`` (an FMA on CPU: one rounding
instead of two, so not the autograd result).  A parameter the model uses twice gets its
data gradient summed by autograd first here, and possibly in another order in the old
single backward; no model in flower_pfl/learning/models.py shares a parameter.  A Prox's
``reg_loss`` is the mean of ``0.5*coef*sum ||w - c||^2`` over every ``PROX_VALUE_EVERY``-th
step (the first included), from ``torch._foreach_norm`` (the autograd value up to float
rounding): the value at every step would cost one more pass over the parameters per
step, a third again of the fused gradient's own three (docs/BENCHMARKS.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn


def prox_penalty(model: nn.Module, center: Sequence[torch.Tensor], coef: float) -> torch.Tensor:
    """``coef/2 * sum ||p - c||^2`` over the parameters; its gradient is ``coef * (p - c)``."""
    terms = [((p - c) ** 2).sum() for p, c in zip(model.parameters(), center)]
    return 0.5 * coef * torch.stack(terms).sum()


@torch.no_grad()
def add_prox_grad_(params: Sequence[torch.Tensor], center: Sequence[torch.Tensor],
                   coef: float, grads: Sequence[torch.Tensor] | None = None,
                   value: bool = False) -> float | None:
    """Add the gradient of ``prox_penalty`` -- ``coef * (p - c)`` -- to the gradients of
    ``params`` in place, bit for bit what autograd adds for it.

    ``grads``: the data loss's gradients (e.g. ``torch.autograd.grad``'s output), updated
    in place; by default each parameter's ``.grad`` (set to the prox gradient where it is
    None).  ``value``: also return ``coef/2 * sum ||p - c||^2`` (one more read pass).
    """
    params = params if isinstance(params, list) else list(params)
    diff = torch._foreach_sub(params, center if isinstance(center, list) else list(center))
    out = None  # diff: w - c, as autograd's sub
    if value:
        out = 0.5 * coef * sum(float(n) ** 2 for n in torch._foreach_norm(diff))
    if coef != 1.0:  # float32(coef) * (w - c): autograd's rounding; 1 * x is x exactly
        torch._foreach_mul_(diff, coef)
    if grads is None:
        grads = [p.grad for p in params]
        if any(g is None for g in grads):  # no data gradient: the prox gradient alone
            for p, d in zip(params, diff):
                if p.grad is None:
                    p.grad = d
            kept = [i for i, g in enumerate(grads) if g is not None]
            grads, diff = [grads[i] for i in kept], [diff[i] for i in kept]
    if grads:
        # (arg-type: the None gradients were dropped above; mypy still sees Tensor | None)
        torch._foreach_add_(list(grads), diff)  # type: ignore[arg-type]  # data + prox
    return out


PROX_VALUE_EVERY = 10  # train(): a Prox's value (reg_loss) is sampled every 10th step


@dataclass(frozen=True)
class Prox:
    """The proximal term ``coef/2 * ||w - center||^2`` as a regularizer for :func:`train`.

    ``train`` applies it as a gradient (:func:`add_prox_grad_`) after the data loss's
    backward pass; calling it gives the autograd term (:func:`prox_penalty`)."""

    center: Sequence[torch.Tensor]
    coef: float

    def __call__(self, model: nn.Module) -> torch.Tensor:
        return prox_penalty(model, self.center, self.coef)
