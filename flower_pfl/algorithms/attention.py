"""Attention weights of FedAMP, HeurFedAMP and FedACS -- pure numpy, no Flower.

All functions take rows of a pairwise matrix (``rows[k]`` = client ``self_idx[k]``
against all n stored clients) and a boolean ``peers`` mask over the n clients (the
clients whose model the server holds).  They return a weight matrix ``Xi`` of shape
(len(rows), n) whose rows sum to 1 and are zero outside ``peers`` and the client itself;
the personalized cloud/intermediate models are then ``U = Xi @ W`` (one matmul, see
:meth:`flower_pfl.model_store.ModelStore.combine`).
"""

from __future__ import annotations

import math

import numpy as np


class DegenerateAttention(ValueError):
    """The hyper-parameters switch the attention mechanism off (e.g. every weight underflows)."""


def _others(peers: np.ndarray, self_idx: np.ndarray) -> np.ndarray:
    """(m, n) mask: peer j of row k, excluding the client itself."""
    mask = np.broadcast_to(np.asarray(peers, dtype=bool), (len(self_idx), len(peers))).copy()
    mask[np.arange(len(self_idx)), self_idx] = False
    return mask


def fedamp_alpha_bound(sigma: float, num_others: int) -> float:
    """Largest alpha_k that keeps every xi_ii >= 0 whatever the distances.

    A'(x) = exp(-x/sigma)/sigma <= 1/sigma, so sum_{j!=i} xi_ij <= alpha_k * m / sigma.
    """
    return float("inf") if num_others == 0 else sigma / num_others


def fedamp_weights(sq_dist: np.ndarray, self_idx: np.ndarray, peers: np.ndarray,
                   alpha_k: float, sigma: float) -> np.ndarray:
    """FedAMP eq. 5/7: xi_ij = alpha_k * A'(||w_i - w_j||^2) with A(x) = 1 - exp(-x/sigma),
    so A'(x) = exp(-x/sigma)/sigma, for peers j != i; xi_ii = 1 - sum_{j!=i} xi_ij.

    Raises DegenerateAttention when xi_ii < 0 (alpha_k above the bound) or when every
    off-diagonal weight underflows to 0 although peers exist (sigma far too small:
    FedAMP would silently run as Local training).  Weights that are tiny but not 0 are
    the strategy's to report (:func:`offdiag_mass`).
    """
    self_idx = np.asarray(self_idx)
    others = _others(peers, self_idx)
    xi = np.where(others, alpha_k * np.exp(-np.asarray(sq_dist, dtype=np.float64) / sigma) / sigma,
                  0.0)
    return _fedamp_finish(xi, others, self_idx, sq_dist, alpha_k, sigma)


def _fedamp_finish(xi: np.ndarray, others: np.ndarray, self_idx: np.ndarray,
                   sq_dist: np.ndarray, alpha_k: float, sigma: float) -> np.ndarray:
    off = xi.sum(axis=1)
    if others.any() and not (xi[others] > 0).any():
        raise DegenerateAttention(
            f"FedAMP: every attention weight underflows to 0 (sigma = {sigma:.3g} is tiny next "
            f"to the squared model distances, median {np.median(np.asarray(sq_dist)[others]):.3g}"
            f"); this would be Local training. Use sigma: auto or a sigma near the squared "
            f"distances.")
    if (off > 1.0 + 1e-9).any():
        raise DegenerateAttention(
            f"FedAMP: alpha_k = {alpha_k:.3g} makes a self-weight xi_ii negative (sum of "
            f"messages up to {off.max():.3g}); keep alpha_k <= sigma/(clients-1) = "
            f"{fedamp_alpha_bound(sigma, int(others.sum(axis=1).max())):.3g} or use alpha-k: auto.")
    xi[np.arange(len(self_idx)), self_idx] = np.maximum(1.0 - off, 0.0)
    return xi


def fedamp_auto_weights(sq_dist: np.ndarray, self_idx: np.ndarray, peers: np.ndarray,
                        sigma: float, min_self_weight: float, decay: float = 1.0
                        ) -> tuple[np.ndarray, float]:
    """FedAMP eq. 5/7 with ``alpha-k: auto``: the largest alpha_k (times ``decay``, the
    schedule) that keeps every row's self weight xi_ii >= ``min_self_weight`` for THESE
    distances:  alpha_k = (1 - min_self_weight) / max_i sum_{j!=i} A'(d_ij).

    The weights are alpha_k A'(d_ij) exactly, computed with the common factor
    exp(-d_min/sigma) taken out (d_min: the smallest peer distance), so a sharp sigma
    cannot underflow every weight to 0.  Returns (Xi, log(alpha_k)) -- alpha_k itself
    overflows when sigma is far below the distances.
    """
    self_idx = np.asarray(self_idx)
    others = _others(peers, self_idx)
    if not others.any():
        xi = np.zeros(np.shape(sq_dist))
        xi[np.arange(len(self_idx)), self_idx] = 1.0
        return xi, 0.0
    d = np.asarray(sq_dist, dtype=np.float64)
    d_min = float(d[others].min())
    rel = np.where(others, np.exp(-(d - d_min) / sigma), 0.0)  # A'(d) sigma e^{d_min/sigma}
    top = float(rel.sum(axis=1).max())
    xi = rel * ((1.0 - min_self_weight) * decay / top)
    # alpha_k = (1 - m) decay sigma e^{-d_min/sigma} / top, in logs
    log_alpha = math.log((1.0 - min_self_weight) * decay * sigma / top) + d_min / sigma
    return _fedamp_finish(xi, others, self_idx, d, math.exp(min(log_alpha, 700.0)), sigma), \
        log_alpha


def offdiag_mass(xi: np.ndarray, self_idx: np.ndarray) -> np.ndarray:
    """Per row: the weight on peers, 1 - xi_ii (0: the client trains alone, i.e. Local)."""
    return 1.0 - np.asarray(xi)[np.arange(len(self_idx)), np.asarray(self_idx)]


def peak_over_mean(xi: np.ndarray, self_idx: np.ndarray) -> float:
    """max / mean of the non-zero peer weights: ~1 means uniform attention over peers."""
    off = np.array(xi, dtype=np.float64)
    off[np.arange(len(self_idx)), np.asarray(self_idx)] = 0.0
    nonzero = off[off > 0]
    return float(nonzero.max() / nonzero.mean()) if nonzero.size else 0.0


def heurfedamp_weights(cosine: np.ndarray, self_idx: np.ndarray, peers: np.ndarray,
                       sigma: float, self_weight: float) -> np.ndarray:
    """HeurFedAMP eq. 8: xi_ij = softmax_{j != i}(sigma * cos(w_i, w_j)) * (1 - xi_ii).

    A client with no peers yet keeps all weight on itself (xi_ii = 1).
    """
    self_idx = np.asarray(self_idx)
    others = _others(peers, self_idx)
    logits = np.where(others, sigma * np.asarray(cosine, dtype=np.float64), -np.inf)
    has_peer = others.any(axis=1)
    top = np.where(has_peer, logits.max(axis=1), 0.0)
    expo = np.where(others, np.exp(logits - top[:, None]), 0.0)  # stable softmax
    norm = np.where(has_peer, expo.sum(axis=1), 1.0)
    xi = expo / norm[:, None] * (1.0 - self_weight)
    xi[np.arange(len(self_idx)), self_idx] = np.where(has_peer, self_weight, 1.0)
    return xi


def quantile_threshold(similarity: np.ndarray, p: float) -> float:
    """FedACS delta^k: the p-quantile of ALL entries of the similarity matrix S^k."""
    return float(np.quantile(np.asarray(similarity, dtype=np.float64), p))


def fedacs_weights(cosine: np.ndarray, self_idx: np.ndarray, peers: np.ndarray,
                   delta: float) -> np.ndarray:
    """FedACS eq. 4: u_i = sum_j 1[s_ij > delta] s_ij w_j / sum_j 1[s_ij > delta] s_ij.

    ``cosine``: (m, n) rows of S for the clients ``self_idx`` (m,); ``peers``: (n,) bool;
    returns Xi (m, n), rows summing to 1.  The comparison is strict, as the paper's: a
    peer with s_ij == delta exactly is NOT selected (so p = 1, delta = max S = 1, is Local
    even for a peer identical to the client).  The client itself is always selected
    (s_ii = 1 is the largest similarity).  Only positive similarities are used as weights
    so that u_i stays a convex combination; :func:`fedacs_dropped` counts the pairs this
    leaves out.
    """
    self_idx = np.asarray(self_idx)
    s = np.asarray(cosine, dtype=np.float64)
    selected = _others(peers, self_idx) & (s > delta) & (s > 0)
    selected[np.arange(len(self_idx)), self_idx] = True
    w = np.where(selected, s, 0.0)
    w[np.arange(len(self_idx)), self_idx] = 1.0  # cos(w_i, w_i)
    return w / w.sum(axis=1, keepdims=True)


def fedacs_dropped(cosine: np.ndarray, self_idx: np.ndarray, peers: np.ndarray,
                   delta: float) -> np.ndarray:
    """Per row (m,): the peers the literal eq. 4 selects (s_ij > delta) that
    :func:`fedacs_weights` drops because s_ij <= 0 -- non-zero only when delta < 0."""
    s = np.asarray(cosine, dtype=np.float64)
    return (_others(peers, np.asarray(self_idx)) & (s > delta) & (s <= 0)).sum(axis=1)


def consensus_weights(cosine: np.ndarray, peers: np.ndarray) -> np.ndarray:
    """Similarity-weighted mean over ALL stored peers, ignoring the client's own row.

    ``cosine``: (m, n) rows of S; ``peers``: (n,) bool; returns (m, n) weights, rows
    summing to 1.  FedACS' choice for a client that has never uploaded: its stored model
    is only the initial model, which says nothing about its data, so it starts from the
    consensus of the stored models (like FedAvg's global model) until its first upload.
    Negative similarities weigh 0.  A row with no stored peer of cos > 0 -- an all-zero
    initial model (``model: scalar`` starts at theta = 0) has cosine 0 to every model --
    takes the plain mean of the stored peers (:func:`consensus_fallback` tells which rows).
    Raises ValueError when no peer is stored at all.
    """
    peers = np.asarray(peers, dtype=bool)
    if not peers.any():
        raise ValueError("consensus_weights needs at least one stored peer")
    s = np.where(peers[None, :], np.maximum(np.asarray(cosine, dtype=np.float64), 0.0), 0.0)
    fallback = consensus_fallback(cosine, peers)
    s[fallback] = peers.astype(np.float64)  # no similarity to weight by: the plain mean
    return s / s.sum(axis=1, keepdims=True)


def consensus_fallback(cosine: np.ndarray, peers: np.ndarray) -> np.ndarray:
    """(m,) bool: the rows of ``cosine`` with no stored peer of cos > 0, whose consensus
    (:func:`consensus_weights`) is the plain mean of the stored peers."""
    s = np.asarray(cosine, dtype=np.float64)
    return ~((s > 0) & np.asarray(peers, dtype=bool)[None, :]).any(axis=1)
