"""PLGU math (Qu et al., CVPR 2023, "How to Prevent the Poor Performance Clients for pFL?"),
pure torch/numpy -- no Flower import.

Layer personalization score, eq. 6 (PLGU-LF) / eq. 10 (PLGU-GRep, on the body layers):

    xi_{i,l} = ||theta_{i,l} - w_l|| / dim(w_l),   normalized so that sum_l xi_{i,l} = 1

  ``||.||`` is the Euclidean norm over ALL parameters of layer l (weight and bias together),
  dim(w_l) their number ("the number of parameters on layer l"): BatchNorm running
  statistics are not parameters and are not scored (the clients pass parameter entries
  only). A "layer" is one group of :func:`flower_pfl.learning.models.layer_groups`.
  Open point: all distances zero (a client whose personal model IS the global one, e.g. on
  its first participation) -- eq. 6 is 0/0; we return uniform scores 1/L (no layer is
  more personal than another).

LWSAM perturbation, eq. 5 with p = q = 2 (Algorithm 1, line 6), normalised on the layers
it is applied to:

    eps_l = rho * Lambda_l * g_l / ||Lambda g||,   Lambda = diag(lambda_1, ..., lambda_L)

  Eq. 5 as printed divides by (||g||_q^q)^(p-1) = ||g||^2, which makes the radius depend on
  the gradient's scale; Foret et al.'s dual-norm solution divides by ||g||.  We divide by
  ||Lambda g|| over the perturbed layers, so that (tested on the CNN):
    * ||eps|| = rho exactly, whatever the scores (the same radius as FedSAM's rho);
    * uniform scores give SAM's eps = rho g/||g|| exactly (FedSAM);
    * a higher score means more perturbation: ||eps_l|| / ||eps_l^SAM|| is proportional to
      lambda_l ("a higher value of xi_{i,l} scales more perturbation", section 3.2).
  The overall scale of Lambda cancels, so eq. 6's normalisation (sum xi = 1) does not
  matter; we still use Lambda_l = L * xi_l (mean 1).  (The earlier rule, rho Lambda g/||g||
  with Lambda normalised over ALL layers but applied to the shared ones only, gave the
  CNN's big layers 3-8% of SAM's perturbation and a radius of ~0.55 rho.)

Algorithm 1 as printed (``reading: two-model``, PLGU-LF's default): TWO models per client,
the personalized theta~ and a full global copy w~ (w~^{t,0} = w^t); per step k on a
mini-batch B:

    4  g   = grad F_B(theta~^{t,k})
    5  theta~^{t,k+1} = theta~^{t,k} - eta g                    (plain SGD)
    6  eps = eq. 5 from g over ALL layers, Lambda from eq. 6
    7  g~  = grad F_B(theta~^{t,k} + eps)                       (at the perturbed theta~)
    8  w~^{t,k+1} = w~^{t,k} - eta g~

  :func:`two_model_train`.  The client uploads Delta = w~^{t,K} - w~^{t,0} of every layer
  (Algorithm 2 line 10) and keeps theta~^{t,K}.  BatchNorm (open point: Algorithm 1 runs
  only theta~ forward): w~ also runs forward in train mode on B at w~^{t,k} (no gradient),
  so its running statistics follow the data; the perturbed pass leaves every buffer as it
  was (theta~'s statistics move once per step).  Models without buffers: nothing changes.
  ``reading: one-model`` keeps the earlier reading (one model: personal layers plain SGD,
  shared layers the LWSAM step).

pFedHN (Shamsian et al., ICML 2021): theta_i = h(v_i; phi), a hypernetwork of 3 fully
connected layers (PLGU section 6.1: "The HN includes 3 fully connected layers") from a
learned client embedding v_i to the target model's flat parameter vector. After the client
trained theta_i into theta~_i, the server follows the gradient
``(d theta_i / d(phi, v_i))^T (theta_i - theta~_i)`` (pFedHN's update rule), computed here by
autograd with ``grad_outputs = theta_i - theta~_i``.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _flat(arrays: Iterable[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


def layer_distances(personal: Sequence[Sequence[np.ndarray]],
                    reference: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
    """Eq. 6 before normalization: ||theta_l - w_l|| / dim(w_l) for each layer l.

    ``personal[l]`` and ``reference[l]`` are the arrays of layer l (weight, bias, ...)."""
    if len(personal) != len(reference):
        raise ValueError(f"{len(personal)} personal layers vs {len(reference)} reference layers")
    out = np.empty(len(personal))
    for l, (p, w) in enumerate(zip(personal, reference)):
        diff = _flat(p) - _flat(w)
        out[l] = np.linalg.norm(diff) / max(diff.size, 1)
    return out


def layer_scores(personal: Sequence[Sequence[np.ndarray]],
                 reference: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
    """Eq. 6 / eq. 10: xi_l normalized to sum 1 (uniform when every distance is 0)."""
    d = layer_distances(personal, reference)
    total = d.sum()
    if not np.isfinite(total):
        raise ValueError("non-finite layer distance (a model holds NaN/inf)")
    if total <= 0:
        return np.full(len(d), 1.0 / len(d))
    return d / total


def lwsam_scaling(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """Lambda_l = L * xi_l (mean 1): uniform scores give Lambda = I, i.e. SAM."""
    xi = np.asarray(scores, dtype=np.float64)
    return xi * len(xi)


def split_layers(scores: Sequence[float] | np.ndarray, num_personal: int
                 ) -> tuple[list[int], list[int]]:
    """Algorithm 2, line 7: (L^Per = the D layers with the largest xi, L^Uni = the rest),
    each sorted; ties go to the earlier layer."""
    xi = np.asarray(scores, dtype=np.float64)
    d = min(max(int(num_personal), 0), len(xi))
    order = sorted(range(len(xi)), key=lambda l: (-xi[l], l))
    personal = sorted(order[:d])
    return personal, [l for l in range(len(xi)) if l not in personal]


def lwsam_perturbation(grads: Sequence[torch.Tensor], scales: Sequence[float], rho: float
                       ) -> list[torch.Tensor]:
    """Eq. 5 (p = q = 2): eps_k = rho * scales[k] * g_k / ||Lambda g|| over all given tensors.

    ``scales[k]`` is Lambda of the layer tensor k belongs to; ||eps|| = rho.  A zero
    gradient (or all-zero scales) gives a zero perturbation (SAM's ascent direction is
    undefined there)."""
    if len(grads) != len(scales):
        raise ValueError(f"{len(grads)} gradients vs {len(scales)} scales")
    if not grads:
        return []
    # (arg-type: grads is not empty, so the sum is a Tensor, never sum()'s start 0)
    norm = torch.sqrt(sum(((g.detach().double() * float(s)) ** 2).sum()  # type: ignore[arg-type]
                          for g, s in zip(grads, scales)))
    if rho == 0 or float(norm) == 0.0:
        return [torch.zeros_like(g) for g in grads]
    return [(rho * float(s) / norm).to(g.dtype) * g.detach() for g, s in zip(grads, scales)]


def running_stats(model: nn.Module) -> list[torch.Tensor]:
    """The model's buffers (BatchNorm running_mean / running_var / num_batches_tracked);
    empty for the MCLR, DNN and CNN."""
    return list(model.buffers())


def perturbed_gradient(model: nn.Module, tensors: Sequence[torch.Tensor],
                       eps: Sequence[torch.Tensor], xb: torch.Tensor, yb: torch.Tensor,
                       loss_fn: LossFn) -> tuple[torch.Tensor, ...]:
    """g~ = the gradient of the batch loss w.r.t. ``tensors`` at tensors + eps.

    The perturbed forward runs in the model's mode (train: BatchNorm normalises with the
    batch's own statistics, as the first pass does) but leaves no trace: the tensors AND
    the model's buffers (BatchNorm running statistics and step counter) are restored bit
    for bit afterwards (copies, not subtractions), so the running statistics move once per
    step, with the unperturbed pass."""
    saved = [p.detach().clone() for p in tensors]
    buffers = running_stats(model)
    saved_buffers = [b.detach().clone() for b in buffers]
    with torch.no_grad():
        for p, e in zip(tensors, eps):
            p.add_(e)
    grads = torch.autograd.grad(loss_fn(model(xb), yb), list(tensors))
    with torch.no_grad():
        for p, s in zip(tensors, saved):
            p.copy_(s)
        for b, s in zip(buffers, saved_buffers):
            b.copy_(s)
    return grads


def two_model_step(theta_model: nn.Module, theta: Sequence[torch.Tensor],
                   w: Sequence[torch.Tensor], opt_theta: torch.optim.Optimizer,
                   opt_w: torch.optim.Optimizer, xb: torch.Tensor, yb: torch.Tensor,
                   scales: Sequence[float], rho: float, loss_fn: LossFn,
                   w_model: nn.Module | None = None) -> float:
    """Lines 4-8 of Algorithm 1 on one mini-batch; returns F_B(theta~^{t,k}).

    ``theta``: the trained tensors of ``theta_model`` (theta~), ``w``: the matching tensors
    of the global copy w~ (its update uses g~, taken at theta~ + eps).  theta~'s parameters
    and buffers are restored bit for bit after the perturbed pass, so its update is plain
    SGD exactly and its running statistics move once (line 4's forward).  ``w_model``: the
    module holding ``w``; when it has buffers (BatchNorm), it runs one forward in train
    mode on the same batch at w~^k (no gradient), so w~'s running statistics follow the
    data as in ordinary training; without buffers nothing is run."""
    loss = loss_fn(theta_model(xb), yb)
    g = torch.autograd.grad(loss, list(theta))
    g_tilde = g
    if rho > 0:
        g_tilde = perturbed_gradient(theta_model, theta, lwsam_perturbation(g, scales, rho),
                                     xb, yb, loss_fn)
    for p, gi in zip(theta, g):
        p.grad = gi.detach()
    opt_theta.step()
    opt_theta.zero_grad(set_to_none=True)
    if w_model is not None and running_stats(w_model):
        with torch.no_grad():
            w_model(xb)  # w~^k's BatchNorm statistics on B (train mode)
    for p, gi in zip(w, g_tilde):
        p.grad = gi.detach()
    opt_w.step()
    opt_w.zero_grad(set_to_none=True)
    return float(loss.detach())


def two_model_train(theta_model: nn.Module, theta: Sequence[torch.Tensor],
                    w: Sequence[torch.Tensor], batches: Iterable[tuple[torch.Tensor,
                                                                       torch.Tensor]],
                    scales: Sequence[float], rho: float, lr: float, momentum: float = 0.0,
                    weight_decay: float = 0.0, loss_fn: LossFn = F.cross_entropy,
                    w_model: nn.Module | None = None,
                    make_opt: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None = None
                    ) -> dict[str, float]:
    """Algorithm 1's K steps (:func:`two_model_step`), one per given mini-batch, both models
    with SGD at the same settings (as :func:`flower_pfl.learning.training.train`), or with
    ``make_opt(tensors)`` (the configured optimizer, Adam/AdamW: LWSAM gives the gradient,
    the optimizer takes the step; ``lr``, ``momentum``, ``weight_decay`` then unused).
    ``w_model``: the module holding ``w`` (trained in train mode; needed for its BatchNorm
    statistics, see :func:`two_model_step`)."""
    theta_model.train()
    if w_model is not None:
        w_model.train()
    if make_opt is not None:
        opt_theta, opt_w = make_opt(list(theta)), make_opt(list(w))
    else:
        opt_theta = torch.optim.SGD(list(theta), lr=lr, momentum=momentum,
                                    weight_decay=weight_decay)
        opt_w = torch.optim.SGD(list(w), lr=lr, momentum=momentum, weight_decay=weight_decay)
    total, steps = 0.0, 0
    for xb, yb in batches:
        total += two_model_step(theta_model, theta, w, opt_theta, opt_w, xb, yb, scales, rho,
                                loss_fn, w_model)
        steps += 1
    return {"train_loss": total / max(steps, 1), "reg_loss": 0.0, "local_steps": float(steps)}


# --------------------------------------------------------------------------- pFedHN
class HyperNetwork(nn.Module):
    """theta = h(v; phi): embedding -> hidden -> hidden -> flat target parameters.

    Three fully connected layers (PLGU section 6.1). The output layer's bias starts at the
    target model's seeded initial weights and its weight matrix at 1% of PyTorch's default
    scale, so every client's first generated model is (close to) the usual initial model
    instead of an arbitrary random vector (our choice; pFedHN does not say how its output
    is initialised)."""

    def __init__(self, embed_dim: int, hidden: int, init_target: np.ndarray,
                 out_scale: float = 0.01) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, int(init_target.size))
        with torch.no_grad():
            self.out.weight.mul_(out_scale)
            self.out.bias.copy_(torch.as_tensor(init_target, dtype=torch.float32))

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc2(torch.relu(self.fc1(v)))))


def hypernetwork_grads(hn: HyperNetwork, embedding: torch.Tensor, trained: torch.Tensor
                       ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """pFedHN's server gradient for one client: grad of <theta_i, theta_i - theta~_i>
    w.r.t. (phi, v_i), with theta_i = h(v_i; phi) and theta~_i the client's trained model.

    Returns (gradients of hn.parameters(), gradient of the embedding)."""
    v = embedding.detach().clone().requires_grad_(True)
    theta = hn(v)
    delta = theta.detach() - trained.to(theta.dtype)  # theta_i - theta~_i = -(client delta)
    grads = torch.autograd.grad(theta, list(hn.parameters()) + [v], grad_outputs=delta)
    return list(grads[:-1]), grads[-1]


def init_embedding(dim: int, seed: int, pid: int) -> np.ndarray:
    """A client's initial embedding v_i ~ N(0, 1/dim) (seeded per run and client)."""
    rng = np.random.default_rng([seed, pid, 0xE3B])
    return (rng.standard_normal(dim) / math.sqrt(dim)).astype(np.float32)
