"""The ``privacy.*`` keys of the run configuration (docs/privacy.md).

:data:`PRIVACY_FIELDS` is merged into :data:`flower_pfl.config.FIELDS`;
:func:`privacy_checks` is the section's part of the cross-key checks.  No torch, no Flower.
"""

from __future__ import annotations

from typing import Any, Mapping

from flower_pfl.fields import Field

PRIVACY_FIELDS: dict[str, Field] = {}


def privacy_checks(values: Mapping[str, Any]) -> list[str]:
    """The ``privacy.*`` problems that need more than one key (none yet)."""
    return []
