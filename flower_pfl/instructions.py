"""What each algorithm's server tells its clients (instructions) and what the clients answer
(replies), declared once as frozen dataclasses that the strategy and its client both import.

A round's message config is a flat ``{key: scalar}`` dict (Flower's ``FitIns.config`` /
``EvaluateIns.config``, a ``ConfigRecord`` on the Message API); a fit's reply is the
``FitRes.metrics`` dict.  :class:`Wire` is the one place that turns a declaration into that
dict and back: :meth:`Wire.to_config` (the strategy) and :meth:`Wire.from_config` (the
client; the strategy for replies).  Both check every value against the field's declared
type and raise :class:`WireError` naming the key; a key the declaration does not name is
ignored (a message carries several declarations: the round's, the paper's, DP's).

Wire keys: a field's name with ``_`` written ``-`` (instructions) or as is (replies,
whose keys are metric names, ``w_theta_gap``), unless :func:`key` names it ('lambda' is a
Python keyword).  Types: ``str``, ``int``, ``float`` (an int is taken and sent as a float;
a bool is never a number), ``bool``; ``X | None`` is a key that may be absent (None is
not sent).  A field with a default may be absent on decode (it takes the default).

Pure data: no torch, no Flower at import (``to_record`` imports ``flwr.app``).  The
papers' formulas these values feed are in each strategy's module docstring.
"""

from __future__ import annotations

import dataclasses
import numbers
import types
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, TypeVar, Union, get_args, get_origin, get_type_hints

#: a config / metrics value on the wire (Flower's ConfigScalar without bytes)
Scalar = Union[bool, int, float, str]
W = TypeVar("W", bound="Wire")


class WireError(ValueError):
    """An instruction or reply that does not match its declaration: a required key missing,
    a value of the wrong type.  The message names the declaration and the key."""


def key(name: str, default: Any = dataclasses.MISSING) -> Any:
    """A field sent under the wire key ``name`` (``lam: float = key("lambda")``)."""
    return field(default=default, metadata={"key": name})


@dataclass(frozen=True)
class Spec:
    """One field of a declaration: attribute, wire key, scalar type, may be absent."""

    attr: str
    key: str
    type: type
    optional: bool
    required: bool


def _scalar_type(hint: Any, where: str) -> tuple[type, bool]:
    """(the scalar type, whether None is allowed) of a field's annotation."""
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(get_args(hint)) == 2:
            return _scalar_type(args[0], where)[0], True
    if hint in (bool, int, float, str):
        return hint, False
    raise TypeError(f"{where}: {hint!r} is not a wire type (str, int, float, bool, X | None)")


def check(value: Any, kind: type, name: str) -> Scalar:
    """``value`` as a ``kind`` on the wire, or WireError naming ``name``: an int (not a bool)
    becomes a float where a float is declared; numpy scalars become Python ones."""
    if kind is bool:
        ok = isinstance(value, bool) or type(value).__name__ == "bool_"
    elif kind is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) \
            and type(value).__name__ != "bool_"
    elif kind is float:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) \
            and type(value).__name__ != "bool_"
    else:
        ok = isinstance(value, str)
    if not ok:
        raise WireError(f"{name} = {value!r} has the wrong type: expected {kind.__name__}, "
                        f"got {type(value).__name__}")
    return kind(value)  # kind is one of the four scalars


@dataclass(frozen=True)
class Wire:
    """Base of every declaration (frozen dataclass fields; see the module docstring)."""

    #: how an attribute's ``_`` is written in its wire key (instructions: ``-``)
    separator: ClassVar[str] = "-"

    @classmethod
    def specs(cls) -> tuple[Spec, ...]:
        """The fields of this declaration, in the order they are sent."""
        if cls not in _SPECS:
            _SPECS[cls] = _specs(cls)
        return _SPECS[cls]

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The wire keys this declaration owns."""
        return tuple(s.key for s in cls.specs())

    def to_config(self) -> dict[str, Scalar]:
        """``{wire key: value}`` in declaration order, each value checked against its type
        (None of an optional field: not sent); WireError names a mistyped key."""
        out: dict[str, Scalar] = {}
        for s in self.specs():
            value = getattr(self, s.attr)
            if value is None and s.optional:
                continue
            out[s.key] = check(value, s.type, f"{type(self).__name__}: '{s.key}'")
        return out

    def to_record(self) -> Any:
        """:meth:`to_config` as Flower's ``flwr.app.ConfigRecord`` (the Message API)."""
        from flwr.app import ConfigRecord

        return ConfigRecord(self.to_config())  # type: ignore[arg-type]  # Scalar <= ConfigScalar

    @classmethod
    def from_config(cls: type[W], config: Mapping[str, Any]) -> W:
        """The declaration read back from a config / metrics dict (or a ConfigRecord):
        WireError names a required key that is missing or a key of the wrong type; keys
        it does not own are ignored."""
        values: dict[str, Any] = {}
        for s in cls.specs():
            if s.key not in config:
                if s.required:
                    raise WireError(f"{cls.__name__}: the key '{s.key}' is missing (the "
                                    f"message has {sorted(map(str, config))})")
                continue
            value = config[s.key]
            values[s.attr] = None if value is None and s.optional else \
                check(value, s.type, f"{cls.__name__}: '{s.key}'")
        return cls(**values)


_SPECS: dict[type[Wire], tuple[Spec, ...]] = {}  # specs() of each declaration, built once


def _specs(cls: type[Wire]) -> tuple[Spec, ...]:
    hints = get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind, optional = _scalar_type(hints[f.name], f"{cls.__name__}.{f.name}")
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out.append(Spec(f.name, f.metadata.get("key", f.name.replace("_", cls.separator)),
                        kind, optional, required))
    return tuple(out)


@dataclass(frozen=True)
class Reply(Wire):
    """A client's answer (fit metrics): keys are the attribute names (``w_theta_gap``)."""

    separator: ClassVar[str] = "_"


# ============================================================ every message (base classes)
@dataclass(frozen=True)
class RoundInstruction(Wire):
    """What every message carries (strategies/base.py ``base_config``; read by
    clients/base.py ``setup``).  Lenient on decode: a hand-made message may omit them."""

    strategy: str = ""
    round: int = 0  # the server round (1-based; 0: not said)
    run_uid: str = ""  # names the client's state folder across a resume ('' : the run id)
    cfg: str | None = None  # the run's configuration (JSON) where it travels with messages
    accepted_round: int | None = None  # the last round whose upload from this client counted


@dataclass(frozen=True)
class EvaluateInstruction(Wire):
    """Every evaluation's part (strategies/evaluation.py; clients/base.py ``evaluate``)."""

    eval_global: bool = False  # also evaluate the global model (global_* metrics)


@dataclass(frozen=True)
class ReceivedModel(Wire):
    """Evaluate the model sent, not the stored personal one (FedAMP family's ``evaluate:
    cloud``: u_i; strategies/message_passing.py, clients/base.py ``personal_model``)."""

    evaluate_received: bool = False


@dataclass(frozen=True)
class NewcomerEval(Wire):
    """A held-out newcomer's evaluation (strategies/evaluation.py; clients/base.py
    ``evaluate_newcomer``, docs/newcomers.md): adapt by the method's newcomer rule for
    ``budget_steps`` local SGD steps (0: the run's local training) and answer accuracy
    before and after; nothing it computes is sent back but those metrics."""

    newcomer: bool = False
    budget_steps: int = 0


@dataclass(frozen=True)
class NewcomerReply(Reply):
    """A newcomer's answer: the metric of the model the server would give it (before) and
    of the model its rule adapted (after), and the local steps the rule took."""

    newcomer_before: float
    newcomer_after: float
    newcomer_steps: int


# ================================================= differential privacy (docs/privacy.md)
@dataclass(frozen=True)
class PrivateFit(Wire):
    """Client-level DP, each fit (privacy/server_side.py ``client_config``; read by
    privacy/client_side.py): the clip C, what the upload's model part is a delta against
    ('sent' | 'zero') and this client's noise share's std (0: ``noise: server``)."""

    clip: float = key("dp-clip")
    reference: str = key("dp-reference")
    noise_std: float = key("dp-noise-std")


@dataclass(frozen=True)
class PrivateReply(Reply):
    """Client-level DP's reply: whether the update was clipped (adaptive clipping's bit)."""

    dp_clipped: float | None = None


@dataclass(frozen=True)
class SampleLevelReply(Reply):
    """Sample-level DP's reply: the client's ε after this fit, at its δ."""

    dp_epsilon: float | None = None
    dp_delta: float | None = None


#: every declaration, for the round-trip test (tests/test_instructions.py)
DECLARATIONS: tuple[type[Wire], ...] = (RoundInstruction, EvaluateInstruction, ReceivedModel,
                                        NewcomerEval, NewcomerReply, PrivateFit,
                                        PrivateReply, SampleLevelReply)
