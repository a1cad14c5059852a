"""What a registered algorithm is: its name, summary and hyper-parameters.

Pure data (no torch, no Flower): the catalog modules (``flower_pfl/catalog/*.py``) build
:class:`Entry` objects from these classes, ``flower_pfl/registry.py`` collects them, and
the strategy and client classes bind themselves to an entry (``registry.strategy_for``,
``registry.client_for``).
Defaults are the papers' values where the paper states them and our choices otherwise.
A ``doc`` says what the parameter does and why its default, in words, and points to the
docs section that holds the measurements (docs/RESULTS.md, docs/algorithms/*.md): run
numbers and issue numbers go stale in code, so they live only in docs/.  No default may
silently disable a method's mechanism.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping


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
    """A registered algorithm: its name, a one-line summary and its hyper-parameters.  The
    Strategy and client classes are bound to it by their own modules (flower_pfl.registry)."""

    name: str
    summary: str
    hyper: Mapping[str, Hyper] = field(default_factory=dict)
    #: checks that need the rest of the configuration: (values, hyper) -> problems
    cross_check: Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]] | None = None

    def validate_hyper(self, params: Mapping[str, Any], prefix: str
                       ) -> tuple[dict[str, Any], list[str]]:
        """Fill defaults, check types and ranges; return (values, problems)."""
        problems: list[str] = []
        values: dict[str, Any] = {}
        for key in params:
            if key not in self.hyper:
                allowed = sorted(self.hyper) or "none"
                problems.append(f"'{prefix}.{key}' is not a hyper-parameter of '{self.name}'"
                                f"{did_you_mean(str(key), self.hyper)} (allowed: {allowed})")
        for key, spec in self.hyper.items():
            value, problem = check_value(f"{prefix}.{key}", params.get(key, spec.default),
                                         spec.types, spec.check, spec.allowed)
            if problem:
                problems.append(problem)
            else:
                values[key] = value
        return values, problems


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` naming the closest of ``candidates`` (difflib, ratio >= 0.6),
    or ``""``.  The one suggestion for every misspelt name: configuration keys, strategies,
    hyper-parameters (config.py, :meth:`Entry.validate_hyper`, the command line)."""
    close = difflib.get_close_matches(name, [str(c) for c in candidates], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


TYPE_NAMES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}


def check_value(name: str, value: Any, types: tuple[type, ...],
                check: Callable[[Any], bool] | None = None, allowed: str = "",
                nullable: bool = False) -> tuple[Any, str | None]:
    """One configuration value against its types and range: ``(value, None)`` -- an integer
    given for a number becomes a float -- or ``(None, the problem in words)``.  A boolean is
    not an integer here; None passes only where ``nullable``.  The one validator of the run
    configuration (config.py's FIELDS) and of every hyper-parameter (catalog's Hyper)."""
    if value is None and nullable:
        return None, None
    if value is None or (isinstance(value, bool) and bool not in types) \
            or not isinstance(value, types):
        expected = " or ".join(dict.fromkeys(TYPE_NAMES.get(t.__name__, t.__name__)
                                             for t in types))
        return None, f"'{name}' = {value!r} has the wrong type: expected {expected} ({allowed})"
    if check is not None and not check(value):
        return None, f"'{name}' = {value!r} is out of range: allowed is {allowed}"
    if isinstance(value, int) and not isinstance(value, bool) and float in types:
        value = float(value)
    return value, None


POS = lambda v: v > 0  # noqa: E731 - a one-line check for the catalog's Hyper tables
NUM = (float, int)


def auto_or_positive(doc: str) -> Hyper:
    """A hyper-parameter that is a positive number or 'auto' (a documented rule)."""
    return Hyper("auto", (str, float, int),
                 lambda v: v == "auto" or (not isinstance(v, str) and v > 0),
                 "a number > 0 or 'auto'", doc)
