"""A strategy's hyper-parameters read once into a typed, frozen view.

``cfg.hyper`` is a string-keyed mapping (the catalog entry's keys, defaults filled in by
validation: :mod:`flower_pfl.hyper`).  Each strategy declares the parameters it reads as a
frozen dataclass whose field ``x_y`` is the key ``x-y`` (a trailing underscore is dropped:
``lambda_`` is ``lambda``), and names it once in its class body,

    ft_hyper = HyperView(FineTuneHyper)      # self.ft_hyper.finetune_steps

(:class:`HyperView`: read with :func:`read_hyper` from ``self.hyper`` on first use, kept;
the base class's ``__init__`` reads every view, :func:`read_views`): a misspelt attribute
is then a type error (mypy) and a field whose key the configuration does not hold fails at
construction, naming it.  Values are taken as validated (no conversion), so a strategy
behaves exactly as when it read the mapping.
"""

from __future__ import annotations

from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Generic, Mapping, TypeVar, overload

V = TypeVar("V")


def hyper_key(field_name: str) -> str:
    """The hyper-parameter key of a view's field: ``alpha_k`` -> ``alpha-k``,
    ``lambda_`` -> ``lambda``."""
    return field_name.rstrip("_").replace("_", "-")


def read_hyper(view: type[V], hyper: Mapping[str, Any]) -> V:
    """``view`` (a dataclass) filled from ``hyper`` by :func:`hyper_key`; a field with a
    default takes it where ``hyper`` lacks the key (a parameter only some subclasses'
    entries have, e.g. PLGU-GRep's ``reading`` read by FedRep).

    Raises TypeError when ``view`` is not a dataclass, and when a field without a default
    has no key in ``hyper`` (the message names the view, the key and the keys there are)."""
    if not is_dataclass(view):
        raise TypeError(f"read_hyper takes a dataclass, got {view!r}")
    values: dict[str, Any] = {}
    for f in fields(view):
        key = hyper_key(f.name)
        if key in hyper:
            values[f.name] = hyper[key]
        elif f.default is MISSING and f.default_factory is MISSING:
            raise TypeError(f"{view.__name__}.{f.name}: the hyper-parameters hold no "
                            f"'{key}' (they hold {sorted(hyper)})")
    return view(**values)


class HyperView(Generic[V]):
    """A class attribute that is, on an instance, ``read_hyper(view, self.hyper)`` -- read on
    first use and kept in the instance (the hyper-parameters do not change in a run)."""

    def __init__(self, view: type[V]) -> None:
        self.view = view
        self.slot = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}_view"

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> HyperView[V]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> V: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> HyperView[V] | V:
        if obj is None:
            return self
        own = vars(obj)  # the instance's attributes: its ``hyper`` and the views read
        kept: V | None = own.get(self.slot)
        if kept is None:
            kept = own[self.slot] = read_hyper(self.view, own["hyper"])
        return kept


def read_views(obj: object) -> None:
    """Read every :class:`HyperView` of ``obj``'s class (and its bases) now, so that a key
    the configuration lacks fails when the strategy is built, not in a round."""
    for klass in type(obj).__mro__:
        for name, value in vars(klass).items():
            if isinstance(value, HyperView):
                getattr(obj, name)
