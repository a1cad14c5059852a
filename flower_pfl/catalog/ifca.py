"""IFCA, the Iterative Federated Clustering Algorithm (Ghosh, Chung, Yin & Ramchandran,
NeurIPS 2020): k cluster models; each client trains the one of lowest loss on its data and
the server averages per cluster (docs/algorithms/ifca.md).

Default k = 2: the smallest number of clusters that is not FedAvg (the paper's experiments
use k = 2 and 4 on rotated MNIST/CIFAR, k = the true number of clusters).
"""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.contract import Decision, Entry, Newcomer, Params, param
from flower_pfl.instructions import Reply, Wire


@dataclass(frozen=True)
class IFCAParams(Params):
    """hyper.ifca."""

    clusters: int = param(
        2, lambda v: v >= 2, "an integer >= 2 (k = 1 is FedAvg)",
        "k, the number of cluster models; each is initialised from its own seed (cluster 0 "
        "is the run's initial model). 2 is the smallest k that clusters (the paper's "
        "experiments: k = 2 or 4, the true number of clusters)")


@dataclass(frozen=True)
class IFCAInstruction(Wire):
    """IFCA (fit and evaluation): how many cluster models the download holds, in order."""

    clusters: int


@dataclass(frozen=True)
class IFCAReply(Reply):
    """IFCA's fit answer: the cluster the client estimated and trained (0-based)."""

    cluster: int


#: why client-level DP is refused: the server reads uploads per cluster, not their mean
PER_CLUSTER = (
    "the server reads each client's upload on its own (its cluster index, and a mean per "
    "cluster), not only the mean of all uploads, so noise on that mean does not protect it "
    "(and sample-level is refused too: the index)")
#: why sample-level DP is refused: the cluster choice is released without noise
CHOICE_UNNOISED = (
    "each client uploads its cluster index, the argmin over k of the loss on ALL its "
    "training data (Ghosh et al. 2020, Alg. 2 line 5), computed outside DP-SGD and sent "
    "without noise: one training record can change it, and the server averages by it")


IFCA = Entry(
    "ifca",
    "IFCA (Ghosh et al., NeurIPS 2020, Alg. 2): k cluster models; each client trains the one "
    "of lowest loss on its training data; the server averages each cluster's uploads.",
    params=IFCAParams,
    privacy=Decision("the trained cluster model w_i and its cluster index",
                     PER_CLUSTER,
                     CHOICE_UNNOISED),
    newcomer=Newcomer("the cluster model of lowest loss on its own training data, chosen at "
                      "evaluation without training (Alg. 2's cluster estimation)", "paper"),
    wire=(IFCAInstruction, IFCAReply),
)

ENTRIES = [IFCA]
