"""pFedBreD_ns (Shi et al., NeurIPS 2023) and pFedMe (Dinh et al., NeurIPS 2020): the math.

No Flower import: pure torch/numpy, unit-tested against hand computations in
tests/test_pfedbred.py.  clients/pfedbred.py runs :func:`local_round` on the client;
strategies/pfedbred.py runs :func:`server_update` on the server.

Problem (eq. 12), spherical-Gaussian prior g = g* = 1/2||.||^2 (section 5):

    min_w E_i F_i(w),   F_i(w) = min_theta f_i(theta) + lambda/2 ||theta - mu_i(w)||^2

Algorithm 1, one round t on client i (r = 1..R local iterations, one mini-batch each):

    line 7   mu_{i,r}    = meta-step (eq. 14), from w_{i,r-1}:
               lg   mu = w_{i,r-1} - eta_alpha grad f_i(w_{i,r-1})
               meg  mu = w_{i,r-1} - eta (w_{i,R}^{(t-1)} - theta_{i,r-1})
               mh   mu = w_{i,r-1} - eta_alpha grad f_i(w_{i,r-1})
                                   - eta (w_{i,R}^{(t-1)} - theta_{i,r-1})
               none mu = w_{i,r-1}                                  (pFedMe, the "Non-PP" row)
    line 8   theta_{i,r} ~ prox_{f_i/lambda}(mu) = argmin f_i(theta) + lambda/2 ||theta - mu||^2,
             K SGD steps of step alpha on the mini-batch
    line 9   w_{i,r} = w_{i,r-1} - alpha_m grad F_i(w_{i,r-1}),
             grad F_i ~ lambda (w_{i,r-1} - theta_{i,r})
    line 12  w^(t) = (1 - beta) w^(t-1) + beta E_I w_{i,R}^(t)        (server)

Choices the paper leaves open (what we chose; docs/algorithms/pfedbred.md):

* Envelope gradient (line 9).  Eq. 13 with the first-order approximation (D mu ~ I,
  Hessian of g* = I) reads lambda (mu - theta); we use lambda (w - theta) as the issue
  and pFedMe (Dinh et al., eq. 8 / Algorithm 1) do.  For pFedMe (mu = w) both agree.
* The meta-step of eq. 14 for meg/mh uses eta (w_{i,R}^{(t-1)} - theta) WITHOUT lambda, as
  printed (eta absorbs lambda); w_{i,R}^{(t-1)} is the client's memorized local model from
  the last round it trained in.  At its first round the memory is the received w^(t-1).
* The lg gradient grad f_i(w_{i,r-1}) is taken on the same mini-batch as the prox step of
  that local iteration (one mini-batch per local iteration, as pFedMe).
* The K prox steps start from theta_{i,r-1} (warm start; theta_{i,0} = theta_{i,R}^{(t-1)}
  as the paper's initialisation says); at a client's first round theta_{i,0} = w^(t-1).
* Server mean E_I: uniform over the sampled clients (the paper's uniform sampling I);
  ``weighting: samples`` gives the sample-weighted mean instead.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from flower_pfl.training import prox_penalty

PRIORS = ("lg", "meg", "mh", "none")  # "none": pFedMe (mu = w)

Tensors = Sequence[torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def uses_loss_gradient(prior: str) -> bool:
    return prior in ("lg", "mh")


def uses_memory(prior: str) -> bool:
    return prior in ("meg", "mh")


@torch.no_grad()
def meta_step(w: Tensors, prior: str, *, grad_f: Tensors | None = None,
              w_memory: Tensors | None = None, theta: Tensors | None = None,
              eta: float = 0.0, eta_alpha: float = 0.0) -> list[torch.Tensor]:
    """mu_{i,r} of eq. 14 (``prior`` none: mu = w, pFedMe)."""
    if prior not in PRIORS:
        raise ValueError(f"unknown prior {prior!r}; allowed: {PRIORS}")
    mu = [p.detach().clone() for p in w]
    if uses_loss_gradient(prior):
        if grad_f is None:
            raise ValueError(f"prior {prior!r} needs grad_f (the loss gradient at w)")
        mu = [m - eta_alpha * g for m, g in zip(mu, grad_f)]
    if uses_memory(prior):
        if w_memory is None or theta is None:
            raise ValueError(f"prior {prior!r} needs w_memory and theta")
        mu = [m - eta * (wm - t) for m, wm, t in zip(mu, w_memory, theta)]
    return mu


def loss_gradient(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor, loss_fn: LossFn
                  ) -> list[torch.Tensor]:
    """grad f_i(w) on one mini-batch (no .grad accumulated on ``model``)."""
    params = list(model.parameters())
    loss = loss_fn(model(xb), yb)
    return [g.detach() for g in torch.autograd.grad(loss, params)]


def prox_steps(theta_model: nn.Module, mu: Tensors, lam: float, alpha: float, steps: int,
               xb: torch.Tensor, yb: torch.Tensor, loss_fn: LossFn) -> float:
    """Line 8: ``steps`` SGD steps (step ``alpha``) on
    f_i(theta; batch) + lambda/2 ||theta - mu||^2, in place on ``theta_model``.  Returns the
    mean data loss over the steps."""
    params = list(theta_model.parameters())
    total = 0.0
    for _ in range(steps):
        data_loss = loss_fn(theta_model(xb), yb)
        total += float(data_loss.detach())
        loss = data_loss + prox_penalty(theta_model, mu, lam)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(alpha * g)
    return total / max(steps, 1)


@torch.no_grad()
def envelope_gradient(w: Tensors, theta: Tensors, lam: float) -> list[torch.Tensor]:
    """grad F_i(w) ~ lambda (w - theta) (first-order, spherical Gaussian)."""
    return [lam * (p - t) for p, t in zip(w, theta)]


@torch.no_grad()
def main_step(w_model: nn.Module, theta: Tensors, lam: float, alpha_m: float) -> None:
    """Line 9, in place: w <- w - alpha_m lambda (w - theta)."""
    params = list(w_model.parameters())
    for p, g in zip(params, envelope_gradient(params, theta, lam)):
        p.sub_(alpha_m * g)


def local_round(w_model: nn.Module, theta_model: nn.Module, w_memory: Tensors | None,
                batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *, prior: str, lam: float,
                alpha: float, alpha_m: float, prox_iters: int, eta: float, eta_alpha: float,
                loss_fn: LossFn) -> dict[str, float]:
    """Lines 6-10 of Algorithm 1, in place on ``w_model`` (w_i) and ``theta_model`` (theta_i).

    ``batches`` yields one (x, y) mini-batch per local iteration r = 1..R.  Returns the mean
    prox data loss, the number of local iterations and of gradient evaluations done.
    """
    w_model.train()
    theta_model.train()
    w_params, theta_params = list(w_model.parameters()), list(theta_model.parameters())
    iters, grads, loss_sum = 0, 0, 0.0
    for xb, yb in batches:
        grad_f = None
        if uses_loss_gradient(prior):
            grad_f = loss_gradient(w_model, xb, yb, loss_fn)
            grads += 1
        mu = meta_step(w_params, prior, grad_f=grad_f, w_memory=w_memory, theta=theta_params,
                       eta=eta, eta_alpha=eta_alpha)
        loss_sum += prox_steps(theta_model, mu, lam, alpha, prox_iters, xb, yb, loss_fn)
        grads += prox_iters
        main_step(w_model, theta_params, lam, alpha_m)
        iters += 1
    return {"train_loss": loss_sum / max(iters, 1), "local_iterations": float(iters),
            "local_steps": float(grads)}


def server_update(w_prev: Sequence[np.ndarray], client_ws: Sequence[Sequence[np.ndarray]],
                  beta: float, weights: Sequence[float] | None = None) -> list[np.ndarray]:
    """Line 12: w^(t) = (1 - beta) w^(t-1) + beta sum_i p_i w_{i,R}
    (p uniform unless ``weights``)."""
    if beta == 0:
        raise ValueError("beta = 0 freezes the global model (w^(t) = w^(t-1))")
    n = len(client_ws)
    p = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, np.float64)
    p = p / p.sum()
    out = []
    for k, prev in enumerate(w_prev):
        mean = np.tensordot(p, np.stack([w[k] for w in client_ws]).astype(np.float64), axes=1)
        out.append(((1.0 - beta) * prev.astype(np.float64) + beta * mean).astype(prev.dtype))
    return out
