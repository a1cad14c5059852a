"""The layout of an upload: the model part, then named extra parts.

An upload (client -> server) is the model's arrays (or the part of the model the clients
upload: FedRep's body) followed by named extra parts that a strategy declares
(:class:`UploadTemplate`: Self-FL's d_m, SCAFFOLD's dc_i).  A download (server -> client)
is laid out the same way: the model, then the parts named in the config key
:data:`EXTRA_ARRAYS` (``"name:count,..."``: SCAFFOLD's c).  Extra parts named ``bounded``
are updates in the model's units (offsets from the round's model) and get the
``max-update-norm`` bound of the model's update (:mod:`.upload_checks`); under differential
privacy that bound clips instead of rejecting (strategies/private_round.py ``clip_upload``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from flower_pfl.reliability.upload_checks import check_update


@dataclass(frozen=True)
class UploadTemplate:
    """What one client's upload must look like: the ``model`` part (arrays shaped like the
    model, or the part of it the clients upload), then each ``extra`` part in order (arrays
    a strategy needs besides the model).  Extra parts named in ``bounded`` are updates in
    the model's units (offsets from the round's model): ``max-update-norm`` bounds each."""

    model: Sequence[np.ndarray]
    extra: Mapping[str, Sequence[np.ndarray]] = field(default_factory=dict)
    bounded: frozenset[str] = frozenset()

    @property
    def arrays(self) -> list[np.ndarray]:
        return [*self.model, *(a for part in self.extra.values() for a in part)]

    @property
    def parts(self) -> list[tuple[str, int]]:
        """(name, number of arrays) of each extra part, in upload order."""
        return [(name, len(part)) for name, part in self.extra.items()]

    def split(self, arrays: Sequence[Any]) -> tuple[list[Any], dict[str, list[Any]]]:
        """(model part, {name: extra part}) of an upload laid out like this template."""
        return split_parts(arrays, self.parts)

    def check(self, arrays: Sequence[np.ndarray], num_examples: int,
              metrics: Mapping[str, Any] | None = None, sent: np.ndarray | None = None,
              max_norm: float | None = None, clip: bool = False) -> str | None:
        """:func:`check_update` against this template (``clip``: under DP, a norm above
        ``max_norm`` is clipped by the caller, not a rejection)."""
        template = self.arrays
        return check_update(arrays, num_examples, [np.shape(a) for a in template],
                            [np.asarray(a).dtype for a in template], metrics, sent, max_norm,
                            model_count=len(self.model), parts=self.parts,
                            bounded=self.bounded, clip=clip)


#: the config key naming the extra parts that follow the model in a download ("name:count,...")
EXTRA_ARRAYS = "extra-arrays"


def describe_parts(extra: Mapping[str, Sequence[Any]]) -> str:
    """The ``EXTRA_ARRAYS`` value of a download whose model is followed by ``extra``."""
    return ",".join(f"{name}:{len(part)}" for name, part in extra.items())


def parse_parts(text: str) -> list[tuple[str, int]]:
    return [(name, int(count)) for name, count in
            (item.rsplit(":", 1) for item in str(text or "").split(",") if item)]


def split_parts(arrays: Sequence[Any], parts: Sequence[tuple[str, int]]
                ) -> tuple[list[Any], dict[str, list[Any]]]:
    """(model, {name: extra part}) of arrays laid out as the model then ``parts``."""
    start = len(arrays) - sum(count for _, count in parts)
    if start < 0:
        raise ValueError(f"{len(arrays)} arrays cannot hold the extra parts {list(parts)}")
    model, extra = list(arrays[:start]), {}
    for name, count in parts:
        extra[name] = list(arrays[start:start + count])
        start += count
    return model, extra
