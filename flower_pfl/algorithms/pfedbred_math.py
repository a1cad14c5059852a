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
             grad F_i ~ lambda (mu_{i,r} - theta_{i,r})        (eq. 13, first order)
    line 12  w^(t) = (1 - beta) w^(t-1) + beta E_I w_{i,R}^(t)        (server)

Choices the paper leaves open (what we chose; docs/algorithms/pfedbred.md):

* Envelope gradient (line 9), ``envelope``.  Eq. 13 with the first-order approximation
  (D mu ~ I, Hessian of g* = I) reads lambda (mu - theta): ``envelope: mu``, the default,
  as printed and as the authors' public code computes it.  ``envelope: w`` takes
  lambda (w - theta) instead (pFedMe's eq. 8 form).  For pFedMe (mu = w) both agree.
* ``mh-lookahead``: the mh of the authors' public code (probably the App. C.2 variant,
  which we do not have).  Per local iteration it draws TWO mini-batches b1, b2:
      g^ = grad f_i(w - eta_alpha grad f_i(w; b1); b2)     (a look-ahead gradient)
      w  <- w - eta_alpha g^                                (applied to w itself)
      mu  = w - eta (w_{i,R}^{(t-1)} - theta_{i,r-1})       (the meg term)
  then line 8 on b2 and line 9 with that mu.
* theta's start, ``theta-init``.  Algorithm 1 line 5: theta_{i,0}^(t) = theta_{i,R}^(t-1)
  (``carry``, pFedBreD's default): the K prox steps warm-start from theta_{i,r-1}, and
  meg / mh read theta_{i,r-1} in eq. 14.  ``restart``: theta_{i,0}^(t) = w^(t-1), the
  received model, each round (Dinh et al.'s pFedMe; pfedme's default).  The authors'
  public code starts each local iteration's prox solver at mu (lg) or at w (meg / mh)
  and keeps theta only for the meg term; we keep the paper's rule (docs/algorithms).
* The meta-step of eq. 14 for meg/mh uses eta (w_{i,R}^{(t-1)} - theta) WITHOUT lambda, as
  printed (eta absorbs lambda); w_{i,R}^{(t-1)} is the client's memorized local model from
  the last round it trained in.  At its first round the memory is the received w^(t-1).
* The lg gradient grad f_i(w_{i,r-1}) is taken on the same mini-batch as the prox step of
  that local iteration (one mini-batch per local iteration, as pFedMe).
* A client's first round (nothing carried yet): theta_{i,0} = w^(t-1).
* Server mean E_I: uniform over the sampled clients (the paper's uniform sampling I);
  ``weighting: samples`` gives the sample-weighted mean instead.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from flower_pfl.algorithms.prox import add_prox_grad_

PRIORS = ("lg", "meg", "mh", "mh-lookahead", "none")  # "none": pFedMe (mu = w)
ENVELOPES = ("mu", "w")

Tensors = Sequence[torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def uses_loss_gradient(prior: str) -> bool:
    return prior in ("lg", "mh")


def uses_memory(prior: str) -> bool:
    return prior in ("meg", "mh", "mh-lookahead")


def batches_per_iteration(prior: str) -> int:
    """mh-lookahead reads two mini-batches per local iteration (b1 for the look-ahead)."""
    return 2 if prior == "mh-lookahead" else 1


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
        grads = list(torch.autograd.grad(data_loss, params))
        add_prox_grad_(params, mu, lam, grads)  # + lambda (theta - mu), autograd's bits
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(alpha * g)
    return total / max(steps, 1)


@torch.no_grad()
def envelope_gradient(centre: Tensors, theta: Tensors, lam: float) -> list[torch.Tensor]:
    """grad F_i ~ lambda (centre - theta) (first-order, spherical Gaussian); eq. 13 as
    printed takes centre = mu, ``envelope: w`` takes centre = w."""
    return [lam * (p - t) for p, t in zip(centre, theta)]


@torch.no_grad()
def main_step(w_model: nn.Module, centre: Tensors, theta: Tensors, lam: float,
              alpha_m: float) -> None:
    """Line 9, in place: w <- w - alpha_m lambda (centre - theta), centre = mu (eq. 13) or
    w (``envelope: w``)."""
    params = list(w_model.parameters())
    for p, g in zip(params, envelope_gradient(centre, theta, lam)):
        p.sub_(alpha_m * g)


def lookahead_gradient(model: nn.Module, b1: tuple[torch.Tensor, torch.Tensor],
                       b2: tuple[torch.Tensor, torch.Tensor], eta_alpha: float, loss_fn: LossFn
                       ) -> list[torch.Tensor]:
    """mh-lookahead: grad f_i(w - eta_alpha grad f_i(w; b1); b2), ``model`` left at w."""
    params = list(model.parameters())
    saved = [p.detach().clone() for p in params]
    g1 = loss_gradient(model, *b1, loss_fn)
    with torch.no_grad():
        for p, g in zip(params, g1):
            p.sub_(eta_alpha * g)
    g2 = loss_gradient(model, *b2, loss_fn)
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
    return g2


def local_round(w_model: nn.Module, theta_model: nn.Module, w_memory: Tensors | None,
                batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *, prior: str, lam: float,
                alpha: float, alpha_m: float, prox_iters: int, eta: float, eta_alpha: float,
                loss_fn: LossFn, envelope: str = "mu") -> dict[str, float]:
    """Lines 6-10 of Algorithm 1, in place on ``w_model`` (w_i) and ``theta_model`` (theta_i).

    ``batches`` yields the mini-batches of the local iterations r = 1..R, in order
    (:func:`batches_per_iteration` of them per iteration: two for mh-lookahead).  Returns the
    mean prox data loss, the number of local iterations and of gradient evaluations done.
    """
    if envelope not in ENVELOPES:
        raise ValueError(f"unknown envelope {envelope!r}; allowed: {ENVELOPES}")
    w_model.train()
    theta_model.train()
    w_params, theta_params = list(w_model.parameters()), list(theta_model.parameters())
    iters, grads, loss_sum = 0, 0, 0.0
    stream = iter(batches)
    for first in stream:
        xb, yb = first
        if prior == "mh-lookahead":
            xb, yb = next(stream)  # b2: the look-ahead's second batch and line 8's
            g = lookahead_gradient(w_model, first, (xb, yb), eta_alpha, loss_fn)
            grads += 2
            with torch.no_grad():
                for p, gi in zip(w_params, g):
                    p.sub_(eta_alpha * gi)
            mu = meta_step(w_params, "meg", w_memory=w_memory, theta=theta_params, eta=eta)
        else:
            grad_f = None
            if uses_loss_gradient(prior):
                grad_f = loss_gradient(w_model, xb, yb, loss_fn)
                grads += 1
            mu = meta_step(w_params, prior, grad_f=grad_f, w_memory=w_memory,
                           theta=theta_params, eta=eta, eta_alpha=eta_alpha)
        loss_sum += prox_steps(theta_model, mu, lam, alpha, prox_iters, xb, yb, loss_fn)
        grads += prox_iters
        centre = mu if envelope == "mu" else [p.detach().clone() for p in w_params]
        main_step(w_model, centre, theta_params, lam, alpha_m)
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
