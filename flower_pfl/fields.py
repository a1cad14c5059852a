"""The run configuration's key type (:class:`Field`) and its one-line range checks.

Shared by :mod:`flower_pfl.config` (the core keys), :mod:`flower_pfl.data_fields` (``data.*``)
and :mod:`flower_pfl.privacy.fields` (``privacy.*``), so each section's keys live beside the
code that reads them and config.py merges them into one table.  No torch, no Flower.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class Field:
    """One YAML key: its type(s), default, a range check and the allowed values in words."""

    types: tuple[type, ...]
    default: Any
    check: Callable[[Any], bool] | None = None
    allowed: str = ""
    nullable: bool = False


def in_(choices: Sequence[str]) -> Callable[[Any], bool]:
    """A check: the value is one of ``choices``."""
    return lambda v: v in choices


POS = lambda v: v > 0  # noqa: E731 - a one-line check for the FIELDS table
NONNEG = lambda v: v >= 0  # noqa: E731 - a one-line check for the FIELDS table
FRACTION = lambda v: 0 < v <= 1  # noqa: E731 - a one-line check for the FIELDS table
OPEN_FRACTION = lambda v: 0 < v < 1  # noqa: E731 - a one-line check for the FIELDS table
