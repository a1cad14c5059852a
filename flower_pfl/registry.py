"""Strategy name -> (Strategy class, NumPyClient class, hyper-parameter defaults).

A new algorithm is one file in ``strategies/``, one in ``clients/`` and one entry here.
Classes are named by import path and loaded lazily, so reading the registry (e.g. to
validate a YAML file) imports neither torch nor Flower.

Defaults are the papers' values where the paper states them and our measured FMNIST
values otherwise (the ``doc`` of each hyper-parameter says which). No default may
silently disable a method's mechanism.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class Hyper:
    """One hyper-parameter of a strategy."""

    default: Any
    types: tuple[type, ...]
    check: Callable[[Any], bool] | None = None
    allowed: str = ""
    doc: str = ""


@dataclass(frozen=True)
class Entry:
    """A registered algorithm: server Strategy + client NumPyClient + hyper-parameters."""

    name: str
    strategy: str  # "module:Class"
    client: str  # "module:Class"
    summary: str
    hyper: Mapping[str, Hyper] = field(default_factory=dict)
    #: checks that need the rest of the configuration: (values, hyper) -> problems
    cross_check: Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]] | None = None

    def strategy_cls(self) -> type:
        return _load(self.strategy)

    def client_cls(self) -> type:
        return _load(self.client)

    def validate_hyper(self, params: Mapping[str, Any], prefix: str) -> tuple[dict, list[str]]:
        """Fill defaults, check types and ranges; return (values, problems)."""
        problems: list[str] = []
        values: dict[str, Any] = {}
        for key in params:
            if key not in self.hyper:
                allowed = sorted(self.hyper) or "none"
                problems.append(f"'{prefix}.{key}' is not a hyper-parameter of '{self.name}' "
                                f"(allowed: {allowed})")
        for key, spec in self.hyper.items():
            value = params.get(key, spec.default)
            is_bool = isinstance(value, bool) and bool not in spec.types
            if is_bool or not isinstance(value, spec.types):
                problems.append(f"'{prefix}.{key}' = {value!r} has the wrong type ({spec.allowed})")
                continue
            if spec.check is not None and not spec.check(value):
                problems.append(f"'{prefix}.{key}' = {value!r} is out of range: allowed is "
                                f"{spec.allowed}")
                continue
            if isinstance(value, int) and not isinstance(value, bool) and float in spec.types:
                value = float(value)
            values[key] = value
        return values, problems


def _load(path: str) -> type:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


_POS = lambda v: v > 0  # noqa: E731
_NUM = (float, int)


def _auto_or_positive(doc: str) -> Hyper:
    """A hyper-parameter that is a positive number or 'auto' (a documented rule)."""
    return Hyper("auto", (str, float, int),
                 lambda v: v == "auto" or (not isinstance(v, str) and v > 0),
                 "a number > 0 or 'auto'", doc)

REGISTRY: dict[str, Entry] = {
    "fedavg": Entry(
        "fedavg", "strategies.fedavg:FedAvg", "clients.fedavg:FedAvgClient",
        "FedAvg (McMahan et al. 2017): one global model, sample-weighted mean of client models.",
    ),
    "local": Entry(
        "local", "strategies.local:Local", "clients.local:LocalClient",
        "Separate/Local training: every client trains only its own model; no weights exchanged.",
    ),
    "fedavg-ft": Entry(
        "fedavg-ft", "strategies.fedavg:FedAvgFT", "clients.fedavg:FedAvgFTClient",
        "FedAvg + local fine-tuning: the global model fine-tuned for `finetune-steps` SGD steps "
        "on the client's data before personalized evaluation.",
        {"finetune-steps": Hyper(10, (int,), _POS, "an integer >= 1",
                                 "local SGD steps (mini-batches) of fine-tuning before evaluation")},
    ),
    "fedamp": Entry(
        "fedamp", "strategies.fedamp:FedAMP", "clients.fedamp:FedAMPClient",
        "FedAMP (Huang et al., AAAI 2021): attentive message passing, eq. 5 weights "
        "xi_ij = alpha_k A'(||w_i-w_j||^2), A(x)=1-exp(-x/sigma); client solves eq. 6.",
        {
            "alpha-k": _auto_or_positive(
                "step size alpha_k of eq. 3/5; 'auto' = alpha-scale * sigma/(n_seen-1), the "
                "largest value that keeps every xi_ii >= 0"),
            "alpha-scale": Hyper(1.0, _NUM, lambda v: 0 < v <= 1, "a number in (0, 1]",
                                 "fraction of the non-negativity bound used when alpha-k is auto"),
            "alpha-schedule": Hyper("constant", (str,),
                                    lambda v: v in ("constant", "inverse-sqrt", "inverse"),
                                    "one of ['constant', 'inverse-sqrt', 'inverse']",
                                    "alpha_k = alpha_1 * {1, 1/sqrt(k), 1/k} (Theorems 1-2)"),
            "lambda": _auto_or_positive(
                "lambda of eq. 1/6; the client's prox weight is lambda/alpha_k. 'auto' = "
                "prox-weight * alpha_k, i.e. a fixed prox weight"),
            "prox-weight": Hyper(1.0, _NUM, _POS, "a number > 0",
                                 "lambda/alpha_k when lambda is auto (SGD needs lr * weight < 1)"),
            "sigma": _auto_or_positive(
                "sigma of A(x)=1-exp(-x/sigma); 'auto' = median squared distance between the "
                "stored client models, recomputed each round"),
        },
    ),
    "heurfedamp": Entry(
        "heurfedamp", "strategies.heurfedamp:HeurFedAMP", "clients.fedamp:FedAMPClient",
        "HeurFedAMP (Huang et al., AAAI 2021, eq. 8): softmax of sigma*cos(w_i, w_j) over j != i, "
        "scaled by 1 - xi_ii.",
        {
            "alpha-k": Hyper(1.0, _NUM, _POS, "a number > 0",
                             "alpha_k of eq. 6: the client's prox weight is lambda/alpha_k"),
            "lambda": Hyper(1.0, _NUM, _POS, "a number > 0", "lambda of eq. 6"),
            "sigma": Hyper(1000.0, _NUM, _POS, "a number > 0",
                           "softmax scale of eq. 8. Cosines of models that share an init are all "
                           "close to 1 (FMNIST CNN: spread ~1e-3), so sigma must be large to "
                           "separate them: measured in-group attention share on the practical "
                           "partition 0.32 at sigma=100 (uniform: 0.27), 1.0 at sigma=1000"),
            "self-weight": Hyper(0.5, _NUM, lambda v: 0 <= v < 1, "a number in [0, 1)",
                                 "xi_ii of eq. 8: the weight of the client's own model"),
        },
    ),
    "fedacs": Entry(
        "fedacs", "strategies.fedacs:FedACS", "clients.fedacs:FedACSClient",
        "FedACS (Chen, Li, Shen): cosine similarity of client models, delta = p-quantile of "
        "all similarities, u_i = similarity-weighted mean of the peers above delta (eq. 4); "
        "clients run local SGD from u_i (eq. 5).",
        {"pick-ratio": Hyper(0.8, _NUM, lambda v: 0 <= v <= 1, "a number in [0, 1]",
                             "p of Algorithm 1: delta is the p-quantile of all entries of S; "
                             "p = 1 selects only the client itself (Local)")},
    ),
    "selffl": Entry(
        "selffl", "strategies.selffl:SelfFL", "clients.selffl:SelfFLClient",
        "Self-FL (Chen et al.): uncertainty-driven local initialisation (eq. 10), local steps "
        "(eq. 8) and variance-weighted aggregation (eq. 11) with smoothing under sampling.",
        {
            "eta": _auto_or_positive(
                "step size eta of eqs. 5/8 (the local SGD learning rate); 'auto' = train.lr"),
            "l-max": Hyper(50, (int,), _POS, "an integer >= 1",
                           "upper clip of the local steps l_m of eq. 8 (section 4.2)"),
            "warmup-rounds": Hyper(0, (int,), lambda v: v >= 0, "an integer >= 0",
                                   "FedAvg rounds before Self-FL starts (section 3.2)"),
            "oracle": Hyper(False, (bool,), None, "true or false",
                            "synthetic task only: use the true sigma_0^2 and sigma_m^2 = "
                            "noise^2/N_m instead of the estimates of eqs. 13-14"),
        },
        cross_check=lambda values, hyper: (
            ["'hyper.selffl.oracle' = true needs data.dataset 'synthetic-gaussian' (only there "
             "are the true variances known)"]
            if hyper.get("oracle") and values["data.dataset"] != "synthetic-gaussian" else []),
    ),
}


def get(name: str) -> Entry:
    if name not in REGISTRY:
        raise KeyError(f"unknown strategy '{name}'; registered: {sorted(REGISTRY)}")
    return REGISTRY[name]
