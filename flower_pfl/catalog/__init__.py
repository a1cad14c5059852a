"""The papers' contracts: one module per paper (or family of baselines), each declaring,
for every strategy it registers (``ENTRIES: list[Entry]``), its parameters, its messages
(server -> client instructions, client -> server replies), its privacy decision per DP
mode, its mechanism and its newcomer rule (:mod:`flower_pfl.contract`).  The strategy,
the client, the configuration, the privacy policy and the docs' tables all read them.

``flower_pfl.registry`` imports every module here; nothing here imports torch or Flower.
"""

from __future__ import annotations

from typing import Mapping

#: ``train.*`` keys that act only when another key leaves its default: Adam's and AdamW's
#: settings need ``train.optimizer`` adam/adamw, a schedule's parameters need a
#: ``train.lr-schedule`` that reads them (flower_pfl.config refuses them otherwise)
NEEDS = {"train.betas": "train.optimizer", "train.eps": "train.optimizer",
         "train.lr-gamma": "train.lr-schedule", "train.lr-step-rounds": "train.lr-schedule",
         "train.lr-min": "train.lr-schedule", "train.lr-horizon": "train.lr-schedule"}


#: mechanisms several contracts share (flower_pfl.contract.Mechanism's what / otherwise)
#: the attention family: the weights compare a client's OWN uploaded model with its peers
CLOUD = ("a cloud model u_i weighted by its own uploaded model's similarity to its peers",
         "the weights compare the initial model with the peers")
#: FedRep and PLGU-GRep: the client's own head
HEAD = ("its own head h_i carried over from an earlier round",
        "the initial head; an untrained client evaluates (initial head, global body)")
#: pFedHN and PLGU-GHN: the client's own embedding
EMBEDDING = ("its embedding v_i trained in an earlier round",
             "h(v_i) of the initial random embedding")


def refusals(reasons: Mapping[str, str]) -> dict[str, str]:
    """An entry's ``refuses`` (train key -> the paper's reason): ``reasons`` plus every key of
    :data:`NEEDS` whose key it needs is refused, with that refusal's reason -- a method that
    refuses Adam refuses Adam's ``train.betas``, one that refuses schedules refuses
    ``train.lr-gamma``, so docs/training.md's table says "refused" where validation stops."""
    out = dict(reasons)
    for key, needed in NEEDS.items():
        if needed in reasons and key not in out:
            out[key] = f"acts only with another {needed}, which is refused here: {reasons[needed]}"
    return out
