"""PLGU (Qu et al., CVPR 2023) and the methods it builds on / compares with: FedSAM,
FedRep, pFedHN. Defaults: the PLGU paper's section 6.1 where it states them (rho = 0.05,
K = 5 local epochs), our documented choices otherwise (docs/algorithms/plgu.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from flower_pfl.catalog import EMBEDDING, HEAD
from flower_pfl.contract import (
    OWN_LOOP,
    PER_UPLOAD,
    POS,
    WHOLE_MODEL,
    Decision,
    Entry,
    Mechanism,
    Newcomer,
    Params,
    in_,
    param,
)
from flower_pfl.instructions import Reply, Wire


def _reading() -> Any:
    """PLGU-LF's and PLGU-GRep's ``reading`` (a field of each)."""
    return param("two-model", in_(("two-model", "one-model")),
                 "one of ['two-model', 'one-model']",
                 "Algorithm 1's reading: two-model = as printed (theta~ by plain SGD, a global "
                 "copy w~ by the LWSAM gradient at theta~ + eps, Delta of w~ uploaded); "
                 "one-model = the personal layers plain SGD and the shared layers LWSAM in ONE "
                 "model (docs/algorithms/plgu.md)")


# The parameters.  A dataclass's fields are ordered from its last base to its first (the
# reverse of the MRO), then its own: PLGUGRepParams(FedSAMParams, FedRepParams) holds
# FedRep's keys, then rho, then its own reading; PLGUGHNParams pFedHN's keys, then rho.
@dataclass(frozen=True)
class FedSAMParams(Params):
    """hyper.fedsam; the SAM radius every perturbed variant shares."""

    rho: float = param(
        0.05, lambda v: v >= 0, "a number >= 0",
        "radius rho of the (LW)SAM perturbation; 0.05 = PLGU section 6.1 default and the best "
        "value of its Table 4. rho = 0 removes the perturbation (a warning says which method "
        "it becomes)")


@dataclass(frozen=True)
class PLGULFParams(FedSAMParams):
    """hyper.plgu-lf: rho, the reading, D."""

    reading: Literal["two-model", "one-model"] = _reading()
    personal_layers: int = param(
        1, lambda v: v >= 0, "an integer >= 0",
        "D = |L^Per| of Alg. 2: layers kept personal. 1 of the CNN's 4 (PLGU's Fig. 2 example "
        "keeps 1 of 3; its ResNet-18 uses 5 of ~23). 0 = FedSAM-like, >= L = Local (both "
        "warned)")


@dataclass(frozen=True)
class FedRepParams(Params):
    """hyper.fedrep: the epochs of each part (eq. 9, then the body)."""

    head_epochs: int = param(
        5, POS, "an integer >= 1",
        "epochs of head training with the body frozen (eq. 9; K of Algorithm 3 -- PLGU "
        "section 6.1 uses K = 5 local epochs)")
    body_epochs: int = param(
        1, POS, "an integer >= 1",
        "epochs of body (representation) training with the head frozen after the head "
        "(FedRep: one pass; PLGU-GRep: the same number of LWSAM steps, eqs. 11-13)")


@dataclass(frozen=True)
class PLGUGRepParams(FedSAMParams, FedRepParams):
    """hyper.plgu-grep: FedRep's epochs, rho, the reading."""

    reading: Literal["two-model", "one-model"] = _reading()


@dataclass(frozen=True)
class PFedHNParams(Params):
    """hyper.pfedhn: the hypernetwork, the embeddings and their steps."""

    embed_dim: int = param(16, POS, "an integer >= 1",
                           "size of the client embedding v_i (our choice)")
    hidden: int = param(100, POS, "an integer >= 1",
                        "width of the hypernetwork's two hidden layers (3 FC layers, PLGU 6.1; "
                        "width our choice)")
    hn_lr: float = param(1.0, POS, "a number > 0",
                         "SGD step on the hypernetwork with the round's mean gradient; 1.0 "
                         "moves the output bias (the shared part of every generated model) by "
                         "the mean client delta, as FedAvg does (our choice)")
    embed_lr: float = param(1.0, POS, "a number > 0",
                            "SGD step on a client's embedding with its own gradient (our "
                            "choice)")


@dataclass(frozen=True)
class PLGUGHNParams(FedSAMParams, PFedHNParams):
    """hyper.plgu-ghn: pFedHN's keys, then rho."""


# ------------------------------------------- messages (server -> client, client -> server)
@dataclass(frozen=True)
class SAMFit(Wire):
    """FedSAM / pFedHN / PLGU-GHN: the SAM radius rho (0: plain SGD)."""

    rho: float


@dataclass(frozen=True)
class PLGUFit(Wire):
    """PLGU-LF (Algorithm 1): LWSAM radius, personal layers, the reading of line 9."""

    rho: float
    personal_layers: int
    reading: str  # 'one-model' | 'two-model'


@dataclass(frozen=True)
class SharedReply(Reply):
    """FedSAM-family uploads: which arrays the delta covers ('1' shared / '0' personal)."""

    shared: str | None = None  # absent: every array shared


@dataclass(frozen=True)
class PLGUReply(SharedReply):
    """PLGU-LF's fit metrics the server reads (server.csv) besides ``shared``."""

    personal_layers: str | None = None  # the layers kept personal, comma-separated
    xi_max: float | None = None
    xi_min: float | None = None


@dataclass(frozen=True)
class FedRepFit(Wire):
    """FedRep / PLGU-GRep: head and body epochs, the body's LWSAM radius, the reading."""

    head_epochs: int
    body_epochs: int
    rho: float
    reading: str


#: newcomer rules (docs/newcomers.md)
FINE_TUNE = Newcomer("the global model, fine-tuned for the budget (FedAvg-FT)", "derived")
HEAD_ONLY = Newcomer("a head trained for the budget on the frozen global body (the body "
                     "untouched)", "paper")


FEDSAM = Entry(
    "fedsam",
    "FedSAM (Qu et al., ICML 2022): SAM as the local optimizer, w += mean Delta.",
    params=FedSAMParams,
    privacy=Decision("Delta_i = w_i - w (already a delta)", None,
                     OWN_LOOP.format(what="SAM's two-pass step"), reference="zero"),
    wire=(SAMFit, SharedReply),
    newcomer=FINE_TUNE,
)


PLGU_LF = Entry(
    "plgu-lf",
    "PLGU-LF (Qu et al., CVPR 2023, Alg. 2): eq. 6 layer scores, top-D layers kept "
    "personal; Alg. 1's two models (theta~ by SGD, w~ by LWSAM at theta~ + eps), "
    "w += mean Delta of w~.",
    params=PLGULFParams,
    privacy=Decision("Delta_i of the shared layers (personal layers upload zeros and are "
                     "never noised)", None, OWN_LOOP.format(what="LWSAM's two-pass step"),
                     reference="zero"),
    mechanism=Mechanism("PLGU-LF", "layer scores xi (eq. 6) from its own personal model of "
                        "an earlier round", "Lambda = I: FedSAM's step, no personal layers"),
    wire=(PLGUFit, PLGUReply),
)


def _epochs_refused(name: str) -> dict[str, str]:
    """FedRep and PLGU-GRep count a round's passes per part, in their own hyper-parameters."""
    return {"train.epochs": f"FedRep (Collins et al. 2021, Alg. 1; PLGU Alg. 3 lines 7-12, "
                            f"eq. 9) trains the head for hyper.{name}.head-epochs passes with "
                            f"the body frozen, then the body for hyper.{name}.body-epochs "
                            f"passes: train.epochs has no role (train.steps, when set, is the "
                            f"mini-batches of one such pass)"}


FEDREP = Entry(
    "fedrep",
    "FedRep (Collins et al., ICML 2021): personal head (last layer) trained first, then the "
    "shared body; server averages the bodies.",
    params=FedRepParams,
    refuses=_epochs_refused("fedrep"),
    privacy=Decision("the body phi_i (the head never leaves)", None,
                     OWN_LOOP.format(what="FedRep's head-then-body loop")),
    mechanism=Mechanism("FedRep", *HEAD),
    wire=(FedRepFit,),
    newcomer=HEAD_ONLY,
)


PLGU_GREP = Entry(
    "plgu-grep",
    "PLGU-GRep (Qu et al., CVPR 2023, Alg. 3): FedRep whose body update is LWSAM with the "
    "eq. 10 layer scores.",
    params=PLGUGRepParams,
    refuses=_epochs_refused("plgu-grep"),
    privacy=Decision("the body phi_i (the head never leaves)", None,
                     OWN_LOOP.format(what="LWSAM's two-pass step")),
    mechanism=Mechanism("PLGU-GRep", *HEAD),
    wire=(FedRepFit,),
    newcomer=HEAD_ONLY,
)


PFEDHN = Entry(
    "pfedhn",
    "pFedHN (Shamsian et al., ICML 2021): a server hypernetwork maps learned client "
    "embeddings to client models; client deltas are back-propagated into it.",
    params=PFedHNParams,
    privacy=Decision(WHOLE_MODEL,
                     PER_UPLOAD.format(what="each upload moves its own client's embedding v_i"),
                     OWN_LOOP.format(what="the SAM/LWSAM step")),
    mechanism=Mechanism("pFedHN", *EMBEDDING),
    wire=(SAMFit,),
)


PLGU_GHN = Entry(
    "plgu-ghn",
    "PLGU-GHN (Qu et al., CVPR 2023; our reading): pFedHN whose clients train the generated "
    "model with LWSAM, layer scores between their last trained and the generated model.",
    params=PLGUGHNParams,
    privacy=Decision(WHOLE_MODEL,
                     PER_UPLOAD.format(what="each upload moves its own client's embedding v_i"),
                     OWN_LOOP.format(what="LWSAM's two-pass step")),
    mechanism=Mechanism("PLGU-GHN", *EMBEDDING),
    wire=(SAMFit,),
)

ENTRIES = [FEDSAM, PLGU_LF, FEDREP, PLGU_GREP, PFEDHN, PLGU_GHN]
