"""What a paper's contract is made of: its parameters, privacy decision, mechanism and
newcomer rule, declared once in ``flower_pfl/catalog/<paper>.py`` (the paper's contract) and
read by its strategy, its client, the configuration, the privacy policy and the docs.

Parameters are a frozen dataclass per registered name (a subclass of :class:`Params`)
whose fields carry their default, range check and doc through :func:`param`::

    @dataclass(frozen=True)
    class FedAMPParams(Params):
        sigma_scale: float = param(0.2, POS, "a number > 0", "sigma = sigma-scale * ...")

A field ``x_y`` is the configuration key ``hyper.<name>.x-y`` (a trailing underscore is
dropped: ``lambda_`` is ``lambda``).  The accepted types follow the annotation: ``float``
takes an int too, ``str | float`` a word (``'auto'``) or a number, ``Literal[...]`` its
values' type (its check names them), ``bool`` is never a number.  :meth:`Params.hyper`
derives the table :class:`Entry` validates with, :meth:`Params.read` builds the instance
the strategy reads (``self.params``).

Pure data: no torch, no Flower.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import MISSING, dataclass, field
from typing import (
    Any,
    Callable,
    ClassVar,
    Literal,
    Mapping,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from flower_pfl.fields import POS as POS  # the contracts' range check "> 0"
from flower_pfl.fields import in_ as in_  # the contracts' range check "one of"
from flower_pfl.hyper import Hyper, check_value, did_you_mean

P = TypeVar("P", bound="Params")

#: how each annotation's scalar is accepted in a configuration value
_ACCEPTS: dict[Any, tuple[type, ...]] = {float: (float, int), int: (int,), str: (str,),
                                         bool: (bool,)}


def param(default: Any, check: Callable[[Any], bool] | None = None, allowed: str = "",
          doc: str = "") -> Any:
    """A :class:`Params` field: its ``default``, the range ``check`` (None: any value of the
    annotated type), ``allowed`` (the range in words, for errors and docs) and ``doc``
    (what it does and why this default)."""
    return field(default=default, metadata={"check": check, "allowed": allowed, "doc": doc})


def AUTO_OR_POS(v: Any) -> bool:  # noqa: N802 - a range check, named as the tables read it
    """The range check of a parameter that is a number > 0 or ``'auto'``."""
    return bool(v == "auto" or (not isinstance(v, str) and v > 0))


def auto_or_positive(doc: str) -> Any:
    """A :func:`param` that is a positive number or ``'auto'`` (a documented rule); annotate
    it ``str | float``."""
    return param("auto", AUTO_OR_POS, "a number > 0 or 'auto'", doc)


def key_of(field_name: str) -> str:
    """The configuration key of a field: ``alpha_k`` -> ``alpha-k``, ``lambda_`` ->
    ``lambda``."""
    return field_name.rstrip("_").replace("_", "-")


def _accepted(hint: Any, where: str) -> tuple[type, ...]:
    if get_origin(hint) is Literal:  # its values' own types (the range check names them)
        return tuple(dict.fromkeys(t for a in get_args(hint) for t in _accepted(type(a), where)))
    if get_origin(hint) in (Union, types.UnionType):
        out: tuple[type, ...] = ()
        for arg in get_args(hint):
            out += tuple(t for t in _accepted(arg, where) if t not in out)
        return out
    if hint not in _ACCEPTS:
        raise TypeError(f"{where}: {hint!r} is not a parameter type (float, int, str, bool "
                        f"or a union of them)")
    return _ACCEPTS[hint]


@dataclass(frozen=True)
class Params:
    """Base of every paper's parameters (see the module docstring).  The base has no field:
    a method without hyper-parameters uses it as is."""

    _HYPER: ClassVar[dict[type, dict[str, Hyper]]] = {}

    @classmethod
    def hyper(cls) -> dict[str, Hyper]:
        """``{configuration key: Hyper}`` in field order, derived from the fields.  Raises
        TypeError for a field declared without :func:`param` or of a non-scalar type."""
        if cls not in Params._HYPER:
            hints = get_type_hints(cls)
            table: dict[str, Hyper] = {}
            for f in dataclasses.fields(cls):
                where = f"{cls.__name__}.{f.name}"
                if "doc" not in f.metadata or f.default is MISSING:
                    raise TypeError(f"{where}: declare it with param(default, check, "
                                    f"allowed, doc)")
                table[key_of(f.name)] = Hyper(f.default, _accepted(hints[f.name], where),
                                              f.metadata["check"], f.metadata["allowed"],
                                              f.metadata["doc"])
            Params._HYPER[cls] = table
        return Params._HYPER[cls]

    @classmethod
    def read(cls: type[P], hyper: Mapping[str, Any]) -> P:
        """The parameters from ``hyper`` (``cfg.hyper``: validated, defaults filled in),
        taken as they are.  Raises TypeError naming a key ``hyper`` lacks."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            k = key_of(f.name)
            if k not in hyper:
                raise TypeError(f"{cls.__name__}.{f.name}: the hyper-parameters hold no "
                                f"'{k}' (they hold {sorted(hyper)})")
            values[f.name] = hyper[k]
        return cls(**values)


# ------------------------------------------------------------------ privacy (docs/privacy.md)
MODES = ("none", "client-level", "sample-level")
#: what the model part of an upload is a delta against: "sent" (the model the server sent
#: that client this round) or "zero" (the upload already is a delta)
REFERENCES = ("sent", "zero")

#: the reason client-level DP is refused where the server reads uploads one by one
PER_UPLOAD = ("the server reads each client's upload on its own ({what}), not only their "
              "mean, so noise on the aggregate does not protect it; use mode: sample-level")
#: the reason sample-level DP is refused where the client trains with its own loop
OWN_LOOP = ("its clients train what they upload with their own optimizer loop ({what}), "
            "not the DP-SGD loop of learning/training.py; use mode: client-level")
WHOLE_MODEL = "the whole model w_i (delta against the model sent)"


@dataclass(frozen=True)
class Decision:
    """A strategy's DP decisions (flower_pfl/privacy/policy.py reads them): ``client_level``
    / ``sample_level`` is None when the mode gives a real guarantee, else the reason it is
    refused; ``clipped`` says what leaves the client (and is clipped); ``reference``: see
    :data:`REFERENCES`."""

    clipped: str
    client_level: str | None
    sample_level: str | None
    reference: str = "sent"

    def __post_init__(self) -> None:
        if self.reference not in REFERENCES:
            raise ValueError(f"reference {self.reference!r}: one of {REFERENCES}")

    def refusal(self, mode: str) -> str | None:
        """The reason ``mode`` is refused (None: allowed; ``none`` always is)."""
        if mode == "client-level":
            return self.client_level
        if mode == "sample-level":
            return self.sample_level
        return None


# ------------------------------------------------------------------- mechanism (its counts)
#: the default hint: history comes from taking part more than once
MORE_ROUNDS = "run more rounds or raise fraction-fit (each client must take part twice)"


@dataclass(frozen=True)
class Mechanism:
    """What a strategy's mechanism is: ``name`` (the method), ``what`` (the mechanism,
    e.g. "eq. 8/10"), ``otherwise`` (the fallback) and ``hint`` (how to make it run).
    The strategy counts its use per accepted upload (strategies/mechanism.py)."""

    name: str
    what: str
    otherwise: str
    hint: str = MORE_ROUNDS


# ------------------------------------------------------------------------------ newcomers
BASES = ("paper", "derived", "extension")


@dataclass(frozen=True)
class Newcomer:
    """How a client that never trained is personalized: ``rule`` in words, its ``basis``
    (``paper``: the method's paper defines it; ``derived``: it follows from the method's
    objective; ``extension``: ours) -- or ``refused``, the reason there is none."""

    rule: str = ""
    basis: str = ""
    refused: str | None = None

    def __post_init__(self) -> None:
        if (self.refused is None) == (not self.rule):
            raise ValueError("a newcomer rule names its rule or the reason it is refused")
        if self.refused is None and self.basis not in BASES:
            raise ValueError(f"newcomer basis {self.basis!r}: one of {BASES}")


# ------------------------------------------------------------------------------- the entry
@dataclass(frozen=True)
class Entry:
    """A registered algorithm: its name, a one-line summary, its parameters (``params``, a
    :class:`Params` class; ``hyper`` is derived from it), its DP ``privacy`` decision,
    its ``mechanism`` (None: nothing to count), its ``newcomer`` rule (None: not declared
    yet) and the wire classes its messages use (``wire``).  The Strategy and client
    classes are bound to it by their own modules (flower_pfl.registry)."""

    name: str
    summary: str
    privacy: Decision
    params: type[Params] = Params
    mechanism: Mechanism | None = None
    newcomer: Newcomer | None = None
    wire: tuple[type, ...] = ()
    #: checks that need the rest of the configuration: (values, hyper) -> problems
    cross_check: Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]] | None = None
    #: ``train.*`` keys this method does not use (or whose role the method's own
    #: hyper-parameters take; the reason names them), each with the paper's reason: a value
    #: other than the key's default is refused at validation (config.py); every other train
    #: key changes what the client uploads (tests/test_training_recipe.py, docs/training.md)
    refuses: Mapping[str, str] = field(default_factory=dict)

    @property
    def hyper(self) -> dict[str, Hyper]:
        """``{key: Hyper}``: the parameters' table (:meth:`Params.hyper`)."""
        return self.params.hyper()

    def validate_hyper(self, params: Mapping[str, Any], prefix: str
                       ) -> tuple[dict[str, Any], list[str]]:
        """Fill defaults, check types and ranges; return (values, problems)."""
        problems: list[str] = []
        values: dict[str, Any] = {}
        hyper = self.hyper
        for k in params:
            if k not in hyper:
                allowed = sorted(hyper) or "none"
                problems.append(f"'{prefix}.{k}' is not a hyper-parameter of '{self.name}'"
                                f"{did_you_mean(str(k), hyper)} (allowed: {allowed})")
        for k, spec in hyper.items():
            value, problem = check_value(f"{prefix}.{k}", params.get(k, spec.default),
                                         spec.types, spec.check, spec.allowed)
            if problem:
                problems.append(problem)
            else:
                values[k] = value
        return values, problems
