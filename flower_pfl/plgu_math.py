"""PLGU math (Qu et al., CVPR 2023, "How to Prevent the Poor Performance Clients for pFL?"),
pure torch/numpy -- no Flower import.

Layer personalization score, eq. 6 (PLGU-LF) / eq. 10 (PLGU-GRep, on the body layers):

    xi_{i,l} = ||theta_{i,l} - w_l|| / dim(w_l),   normalized so that sum_l xi_{i,l} = 1

  ``||.||`` is the Euclidean norm over ALL entries of layer l (weight and bias together),
  dim(w_l) their number. A "layer" is one group of :func:`flower_pfl.models.layer_groups`.
  Open point: all distances zero (a client whose personal model IS the global one, e.g. on
  its first participation) -- eq. 6 is 0/0; we return uniform scores 1/L (no layer is
  more personal than another).

LWSAM perturbation, eq. 5 with p = q = 2 (Algorithm 1, line 6):

    eps_l = rho * Lambda_l * g_l / ||g||,   Lambda = diag(lambda_1, ..., lambda_L)

  Eq. 5 as printed divides by (||g||_q^q)^(p-1) = ||g||^2; the dual-norm solution of the
  SAM inner problem (Foret et al.) is (||g||_q^q)^(1/p) = ||g|| at p = q = 2, so we read the
  exponent p-1 as the typo it is (with ||g||^2 the radius would depend on the gradient's
  scale). ``||g||`` is the norm over all perturbed layers together. With Lambda = I this is
  SAM's eps = rho g/||g|| (norm rho): FedSAM's local optimizer.

  Scaling Lambda from the scores: the paper's Lambda = diag(xi) with sum xi = 1 would make
  PLGU's radius ~rho/L while FedSAM (same rho = 0.05 in the paper's tables) gets rho. We
  use Lambda_l = L * xi_l (mean 1 over the layers): uniform scores give Lambda = I
  (exactly SAM), and a layer with an above-average score gets a larger share of the
  perturbation -- "a higher value of xi_{i,l} scales more perturbation" (section 3.2).

pFedHN (Shamsian et al., ICML 2021): theta_i = h(v_i; phi), a hypernetwork of 3 fully
connected layers (PLGU section 6.1: "The HN includes 3 fully connected layers") from a
learned client embedding v_i to the target model's flat parameter vector. After the client
trained theta_i into theta~_i, the server follows the gradient
``(d theta_i / d(phi, v_i))^T (theta_i - theta~_i)`` (pFedHN's update rule), computed here by
autograd with ``grad_outputs = theta_i - theta~_i``.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torch import nn


def _flat(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


def layer_distances(personal: Sequence[Sequence], reference: Sequence[Sequence]) -> np.ndarray:
    """Eq. 6 before normalization: ||theta_l - w_l|| / dim(w_l) for each layer l.

    ``personal[l]`` and ``reference[l]`` are the arrays of layer l (weight, bias, ...)."""
    if len(personal) != len(reference):
        raise ValueError(f"{len(personal)} personal layers vs {len(reference)} reference layers")
    out = np.empty(len(personal))
    for l, (p, w) in enumerate(zip(personal, reference)):
        diff = _flat(p) - _flat(w)
        out[l] = np.linalg.norm(diff) / max(diff.size, 1)
    return out


def layer_scores(personal: Sequence[Sequence], reference: Sequence[Sequence]) -> np.ndarray:
    """Eq. 6 / eq. 10: xi_l normalized to sum 1 (uniform when every distance is 0)."""
    d = layer_distances(personal, reference)
    total = d.sum()
    if not np.isfinite(total):
        raise ValueError("non-finite layer distance (a model holds NaN/inf)")
    if total <= 0:
        return np.full(len(d), 1.0 / len(d))
    return d / total


def lwsam_scaling(scores: Sequence[float]) -> np.ndarray:
    """Lambda_l = L * xi_l (mean 1): uniform scores give Lambda = I, i.e. SAM."""
    xi = np.asarray(scores, dtype=np.float64)
    return xi * len(xi)


def split_layers(scores: Sequence[float], num_personal: int) -> tuple[list[int], list[int]]:
    """Algorithm 2, line 7: (L^Per = the D layers with the largest xi, L^Uni = the rest),
    each sorted; ties go to the earlier layer."""
    xi = np.asarray(scores, dtype=np.float64)
    d = min(max(int(num_personal), 0), len(xi))
    order = sorted(range(len(xi)), key=lambda l: (-xi[l], l))
    personal = sorted(order[:d])
    return personal, [l for l in range(len(xi)) if l not in personal]


def lwsam_perturbation(grads: Sequence[torch.Tensor], scales: Sequence[float], rho: float
                       ) -> list[torch.Tensor]:
    """Eq. 5 (p = q = 2): eps_k = rho * scales[k] * g_k / ||g|| over all given tensors.

    ``scales[k]`` is Lambda of the layer tensor k belongs to. A zero gradient gives a zero
    perturbation (SAM's ascent direction is undefined there)."""
    if len(grads) != len(scales):
        raise ValueError(f"{len(grads)} gradients vs {len(scales)} scales")
    if not grads:
        return []
    norm = torch.sqrt(sum((g.detach().double() ** 2).sum() for g in grads))
    if rho == 0 or float(norm) == 0.0:
        return [torch.zeros_like(g) for g in grads]
    return [(rho * float(s) / norm).to(g.dtype) * g.detach() for g, s in zip(grads, scales)]


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
