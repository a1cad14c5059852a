"""FedFomo (Zhang, Sapra, Fidler, Yeung & Alvarez, "Personalized Federated Learning with
First Order Model Optimization", ICLR 2021): each client weighs the peer models it downloads
by their loss improvement on its validation split over their distance, and starts its local
training from that first-order update (docs/algorithms/fedfomo.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.contract import POS, Decision, Entry, Mechanism, Newcomer, Params, param
from flower_pfl.instructions import Reply, Wire


@dataclass(frozen=True)
class FedFomoParams(Params):
    """hyper.fedfomo."""

    peers: int = param(5, POS, "an integer >= 1",
                       "M, the peer models the server sends each client per round (our "
                       "value; the paper varies M)")
    epsilon: float = param(0.3, lambda v: 0 <= v <= 1, "a number in [0, 1]",
                           "epsilon of the server's epsilon-greedy peer choice: each of the M "
                           "slots is a uniformly random peer with this probability, else the "
                           "peer of highest affinity (our value; the paper explores with an "
                           "epsilon-greedy rule)")
    val_fraction: float = param(0.2, lambda v: 0 < v < 1, "a number in (0, 1)",
                                "share of each client's training split held out as its "
                                "validation split (fixed per client; the peers' losses are "
                                "measured there and local training uses the rest)")


@dataclass(frozen=True)
class FedFomoFit(Wire):
    """FedFomo: the peer models the download holds, in order (their partition-ids), and the
    validation share."""

    peer_ids: str  # comma-separated partition-ids, '' for none
    val_fraction: float


@dataclass(frozen=True)
class FedFomoReply(Reply):
    """FedFomo's fit answer: the normalised weight of each peer sent, in order."""

    peer_weights: str  # comma-separated, '' for no peer


#: why client-level DP is refused
PEERS_READ = ("the server sends each client's own stored model to its peers (one by one, "
              "not their mean), so noise on a mean protects nothing (and sample-level is "
              "refused too: the weights)")
#: why sample-level DP is refused
WEIGHTS_UNNOISED = (
    "the peer weights are losses on the client's validation records computed outside DP-SGD "
    "and without noise: they set where its training starts and travel with the upload, so "
    "those records are not protected")


FEDFOMO = Entry(
    "fedfomo",
    "FedFomo (Zhang et al., ICLR 2021): the server keeps each client's latest model and sends "
    "it M peers; the client weighs each by (L(own) - L(peer)) / ||peer - own|| on its "
    "validation split (negatives dropped, normalised), moves its model by the weighted "
    "differences and trains.",
    params=FedFomoParams,
    privacy=Decision("the trained model w_i (stored, sent to peers) and its peer weights",
                     PEERS_READ, WEIGHTS_UNNOISED),
    mechanism=Mechanism("FedFomo", "a first-order update from peers of positive weight",
                        "no peer stored yet, or every peer worse: its own model"),
    newcomer=Newcomer("the first-order update of the initial model by the M peers the server "
                      "sends at evaluation, weighed on its validation split (the update with "
                      "the initial model as its own)", "derived"),
    wire=(FedFomoFit, FedFomoReply),
)

ENTRIES = [FEDFOMO]
