"""What a registered algorithm is: its Strategy, its client and its hyper-parameters.

Pure data (no torch, no Flower): the catalog modules (``flower_pfl/catalog/*.py``) build
:class:`Entry` objects from these classes, and ``flower_pfl/registry.py`` collects them.
Defaults are the papers' values where the paper states them and our measured FMNIST
values otherwise (each ``doc`` says which). No default may silently disable a method's
mechanism.
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


POS = lambda v: v > 0  # noqa: E731 - a one-line check for the catalog's Hyper tables
NUM = (float, int)


def auto_or_positive(doc: str) -> Hyper:
    """A hyper-parameter that is a positive number or 'auto' (a documented rule)."""
    return Hyper("auto", (str, float, int),
                 lambda v: v == "auto" or (not isinstance(v, str) and v > 0),
                 "a number > 0 or 'auto'", doc)
