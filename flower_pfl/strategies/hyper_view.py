"""A strategy's hyper-parameters read once into a typed, frozen view.

``cfg.hyper`` is a string-keyed mapping (the catalog entry's keys, defaults filled in by
validation: :mod:`flower_pfl.hyper`).  Each strategy declares the parameters it reads as a
frozen dataclass whose field ``x_y`` is the key ``x-y`` (a trailing underscore is dropped:
``lambda_`` is ``lambda``) and reads them once, in its ``__init__``, with
:func:`read_hyper`: a misspelt attribute is then a type error (mypy) and a field whose key
the configuration does not hold fails at construction, naming it.  Values are taken as
validated (no conversion), so a strategy behaves exactly as when it read the mapping.
"""

from __future__ import annotations

from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Mapping, TypeVar

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
