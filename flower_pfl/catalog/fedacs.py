"""FedACS (Chen, Li, Shen): similarity-thresholded attention."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flower_pfl.catalog import CLOUD
from flower_pfl.contract import PER_UPLOAD, WHOLE_MODEL, Decision, Entry, Mechanism, Params, param


def UNIT_INTERVAL(v: Any) -> bool:  # noqa: N802 - a range check, named as the tables read it
    """The range check of pick-ratio: a number in [0, 1]."""
    return bool(0 <= v <= 1)


@dataclass(frozen=True)
class FedACSParams(Params):
    """hyper.fedacs."""

    pick_ratio: float = param(0.8, UNIT_INTERVAL, "a number in [0, 1]",
                              "p of Algorithm 1: delta is the p-quantile of all entries of S; "
                              "p = 1 selects only the client itself (Local). The paper does not "
                              "state p; 0.8 "
                              "keeps the most similar fifth of the pairs, which on the "
                              "practical partition are the client's own group "
                              "(docs/algorithms/fedacs.md, 'FedACS')")


FEDACS = Entry(
    "fedacs",
    "FedACS (Chen, Li, Shen): cosine similarity of client models, delta = p-quantile of "
    "all similarities, u_i = similarity-weighted mean of the peers above delta (eq. 4); "
    "clients run local SGD from u_i (eq. 5).",
    params=FedACSParams,
    privacy=Decision(WHOLE_MODEL, PER_UPLOAD.format(
        what="each stored w_j is compared and selected per client"), None),
    mechanism=Mechanism("FedACS", *CLOUD),
)

ENTRIES = [FEDACS]
