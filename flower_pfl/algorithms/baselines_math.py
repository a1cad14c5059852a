"""The update rules of the baselines, as pure functions (torch/numpy, no Flower).

FedProx (Li et al., MLSys 2020), local objective
    h_i(w) = F_i(w) + mu/2 ||w - w^t||^2          -> ``prox.Prox`` (not here).

SCAFFOLD (Karimireddy et al., ICML 2020), Algorithm 1, option II
    client step   y <- y - eta_l (g_i(y) + c - c_i)                       (line 10)
    control       c_i+ = c_i - c + (x - y) / (K eta_l)                     (line 12, option II)
    server        x <- x + eta_g mean_{i in S} (y_i - x),
                  c <- c + |S|/N mean_{i in S} (c_i+ - c_i)                (lines 16-17)
  ``linear_term(model, c - c_i)`` is a loss term whose gradient is exactly c - c_i, so the
  corrected step is plain SGD on F_i + <c - c_i, y> (training.train's regularizer).

APFL (Deng, Kamani & Mahdavi 2020), Algorithm 1, one local step on a mini-batch xi
    w   <- w - eta grad f_i(w; xi)
    v   <- v - eta grad_v f_i(vbar; xi),       vbar = alpha v + (1 - alpha) w
    alpha <- alpha - eta_alpha grad_alpha f_i(vbar; xi)
  Both gradients are taken through the mixture: grad_v = alpha grad f(vbar) and
  grad_alpha = <v - w, grad f(vbar)> (autograd through ``torch.func.functional_call``);
  alpha is clipped to [0, 1] after each step (the paper's alpha lives in [0, 1]).

Per-FedAvg (Fallah, Mokhtari & Ozdaglar, NeurIPS 2020), Algorithm 1, one local step
    w_tmp = w - alpha grad f(w; D)                                   (inner, batch D)
    FO:   w <- w - beta grad f(w_tmp; D')                            (outer, batch D')
    HF:   w <- w - beta (I - alpha H(w; D'')) grad f(w_tmp; D')      (Hessian batch D'')
  with the paper's Hessian-free product
    H(w; D'') g ~ (grad f(w + delta g; D'') - grad f(w - delta g; D'')) / (2 delta).
  D, D', D'' are distinct mini-batches (consecutive batches of one shuffled pass).

Ditto's personal step is SGD on f_i(v) + lambda/2 ||v - w^t||^2 (``prox.Prox``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# ------------------------------------------------------------------------------ SCAFFOLD
def linear_term(model: nn.Module, direction: Sequence[torch.Tensor]) -> torch.Tensor:
    """``sum <p, d>`` over the parameters: its gradient is exactly ``d`` (SCAFFOLD's c - c_i)."""
    return torch.stack([(p * d).sum() for p, d in zip(model.parameters(), direction)]).sum()


def scaffold_client_control(c_i: Sequence[np.ndarray], c: Sequence[np.ndarray],
                            x: Sequence[np.ndarray], y: Sequence[np.ndarray], steps: int,
                            lr: float) -> list[np.ndarray]:
    """Option II: c_i+ = c_i - c + (x - y) / (K eta_l)."""
    if steps < 1 or lr <= 0:
        raise ValueError("SCAFFOLD option II needs K >= 1 local steps and eta_l > 0")
    scale = 1.0 / (steps * lr)
    return [(ci - cc + (xx - yy) * scale).astype(np.float32)
            for ci, cc, xx, yy in zip(c_i, c, x, y)]


# the extra arrays of SCAFFOLD's download and upload (strategies/base.py templates)
CONTROL_DELTA, CONTROL = "control-delta", "control"


def scaffold_control_delta(c: Sequence[np.ndarray], x: Sequence[np.ndarray],
                           y: Sequence[np.ndarray], steps: int, lr: float) -> list[np.ndarray]:
    """dc_i = c_i+ - c_i = -c + (x - y) / (K eta_l): option II's change; the client uploads
    it beside y_i (the template's extra part ``CONTROL_DELTA``, line 13 of SCAFFOLD)."""
    zeros = [np.zeros_like(a) for a in x]
    return scaffold_client_control(zeros, c, x, y, steps, lr)


def scaffold_server(x: Sequence[np.ndarray], c: Sequence[np.ndarray],
                    ys: Sequence[Sequence[np.ndarray]], dcs: Sequence[Sequence[np.ndarray]],
                    weights: Sequence[float], num_clients: int, eta_g: float
                    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """x + eta_g * mean(y_i - x) and c + |S|/N * mean(dc_i).

    The model mean is weighted by ``weights`` (the sample counts, as FedAvg; equal counts
    give the paper's plain mean); the control mean is the paper's plain mean.
    """
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    s = len(ys)
    new_x, new_c = [], []
    for k in range(len(x)):
        delta = np.tensordot(w, np.stack([y[k] for y in ys]).astype(np.float64), axes=1) - x[k]
        new_x.append((x[k] + eta_g * delta).astype(np.float32))
        dc = np.mean(np.stack([d[k] for d in dcs]).astype(np.float64), axis=0)
        new_c.append((c[k] + (s / num_clients) * dc).astype(np.float32))
    return new_x, new_c


def mixture(v: Sequence[torch.Tensor], w: Sequence[torch.Tensor], alpha: torch.Tensor
            ) -> list[torch.Tensor]:
    """vbar = alpha v + (1 - alpha) w, parameter by parameter (differentiable in all three)."""
    return [alpha * vv + (1 - alpha) * ww for vv, ww in zip(v, w)]


def mixture_forward(model: nn.Module, v: Sequence[torch.Tensor], w: Sequence[torch.Tensor],
                    alpha: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The output of ``model``'s architecture with parameters vbar (buffers: the model's)."""
    names = [n for n, _ in model.named_parameters()]
    return functional_call(model, dict(zip(names, mixture(v, w, alpha))), (x,))


def apfl_step(model_w: nn.Module, model_v: nn.Module, alpha: float, xb: torch.Tensor,
              yb: torch.Tensor, lr: float, alpha_lr: float, loss_fn: LossFn,
              adapt_alpha: bool = True) -> tuple[float, float, float]:
    """One APFL step on (xb, yb), in place on both models; returns (alpha, f(w), f(vbar))."""
    # w: plain SGD on its own loss
    loss_w = loss_fn(model_w(xb), yb)
    grads_w = torch.autograd.grad(loss_w, list(model_w.parameters()))
    # v and alpha: through the mixture, with the pre-step w (same xi as the paper)
    w_now = [p.detach() for p in model_w.parameters()]
    a = torch.tensor(float(alpha), requires_grad=adapt_alpha, device=xb.device)
    v_params = list(model_v.parameters())
    loss_mix = loss_fn(mixture_forward(model_v, v_params, w_now, a, xb), yb)
    wrt = v_params + ([a] if adapt_alpha else [])
    grads = torch.autograd.grad(loss_mix, wrt)
    with torch.no_grad():  # (sub_: what -= calls; mypy types a Parameter's -= as a Tensor)
        for p, g in zip(model_w.parameters(), grads_w):
            p.sub_(lr * g)
        for p, g in zip(v_params, grads[:len(v_params)]):
            p.sub_(lr * g)
    if adapt_alpha:
        alpha = float(min(1.0, max(0.0, alpha - alpha_lr * float(grads[-1]))))
    return alpha, float(loss_w.detach()), float(loss_mix.detach())


# ---------------------------------------------------------------------------- Per-FedAvg
def _grads(model: nn.Module, params: Sequence[torch.Tensor], xb: torch.Tensor,
           yb: torch.Tensor, loss_fn: LossFn) -> tuple[list[torch.Tensor], float]:
    names = [n for n, _ in model.named_parameters()]
    params = [p.detach().requires_grad_(True) for p in params]
    loss = loss_fn(functional_call(model, dict(zip(names, params)), (xb,)), yb)
    return list(torch.autograd.grad(loss, params)), float(loss.detach())


def hvp_finite_difference(model: nn.Module, params: Sequence[torch.Tensor],
                          vector: Sequence[torch.Tensor], xb: torch.Tensor, yb: torch.Tensor,
                          loss_fn: LossFn, delta: float) -> list[torch.Tensor]:
    """(grad f(w + delta g) - grad f(w - delta g)) / (2 delta): Per-FedAvg's HF product."""
    plus, _ = _grads(model, [p + delta * v for p, v in zip(params, vector)], xb, yb, loss_fn)
    minus, _ = _grads(model, [p - delta * v for p, v in zip(params, vector)], xb, yb, loss_fn)
    return [(a - b) / (2 * delta) for a, b in zip(plus, minus)]


def perfedavg_direction(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                        alpha: float, variant: str, loss_fn: LossFn, delta: float = 1e-3
                        ) -> tuple[list[torch.Tensor], float]:
    """The meta-gradient at the model's parameters; ``batches`` = (D, D') or (D, D', D'')."""
    w = [p.detach() for p in model.parameters()]
    (x1, y1), (x2, y2) = batches[0], batches[1]
    g_in, loss_in = _grads(model, w, x1, y1, loss_fn)
    w_tmp = [p - alpha * g for p, g in zip(w, g_in)]
    g_out, _ = _grads(model, w_tmp, x2, y2, loss_fn)
    if variant == "fo":
        return g_out, loss_in
    if variant != "hf":
        raise ValueError(f"Per-FedAvg variant must be 'fo' or 'hf', got {variant!r}")
    x3, y3 = batches[2]
    hv = hvp_finite_difference(model, w, g_out, x3, y3, loss_fn, delta)
    return [g - alpha * h for g, h in zip(g_out, hv)], loss_in


def perfedavg_step(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                   alpha: float, beta: float, variant: str, loss_fn: LossFn,
                   delta: float = 1e-3) -> float:
    """w <- w - beta * meta-gradient, in place; returns the inner-batch loss."""
    direction, loss = perfedavg_direction(model, batches, alpha, variant, loss_fn, delta)
    with torch.no_grad():
        for p, d in zip(model.parameters(), direction):
            p.sub_(beta * d)
    return loss


def batches_per_step(variant: str) -> int:
    """Mini-batches one Per-FedAvg update consumes: 2 (FO) or 3 (HF)."""
    return {"fo": 2, "hf": 3}[variant]
