"""A client's part of client-level DP: what leaves it is clipped (and, with
``noise: clients``, carries its noise share).  Numpy only; called by clients/base.py.

The server says, per fit (privacy/server_side.py ``client_config``, a
:class:`~flower_pfl.instructions.PrivateFit`): the clip C, what the model part of the
upload is a delta against (``sent`` = the model part of what it received, ``zero`` = the
upload already is a delta) and its noise share's std (0 under ``noise: server``).  The
upload's first k arrays (k = the received model part's count) are its model part; any
arrays after them (SCAFFOLD's dc_i) are an extra part taken against zeros.  Personal layers
never leave the client, so they are neither clipped nor noised.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from flower_pfl.instructions import PrivateFit, PrivateReply, Scalar
from flower_pfl.privacy.clipping import clip_update
from flower_pfl.privacy.noise import gaussian_like


def is_private(config: Mapping[str, Any]) -> bool:
    """Whether this fit's upload must be clipped (the server sent a :class:`PrivateFit`)."""
    return PrivateFit.keys()[0] in config


def private_upload(upload: Sequence[np.ndarray], received_model: Sequence[np.ndarray],
                   config: Mapping[str, Any], rng: np.random.Generator | None = None
                   ) -> tuple[list[np.ndarray], dict[str, Scalar]]:
    """(the upload clipped -- and noised by its share -- as it leaves, fit metrics).

    ``upload``: the arrays the client would send; ``received_model``: the model part of
    what it received this round.  Raises ValueError where the upload's model part cannot
    be laid against what was received (count or shapes)."""
    sent = PrivateFit.from_config(config)
    clip, share = sent.clip, sent.noise_std
    k = len(received_model)
    if len(upload) < k:
        raise ValueError(f"an upload of {len(upload)} arrays has no {k}-array model part")
    ref = None
    if sent.reference == "sent":
        ref = [*received_model, *(np.zeros_like(a) for a in upload[k:])]
    clipped, norm = clip_update(upload, ref, clip)
    if share > 0:  # this client's share of the aggregate's noise (OS entropy)
        rng = rng if rng is not None else np.random.default_rng()
        noise = gaussian_like(clipped, share, rng)
        clipped = [(np.asarray(a, dtype=np.float64) + e).astype(np.asarray(a).dtype)
                   for a, e in zip(clipped, noise)]
    # only the bit: adaptive clipping's input (noised by the server); the norm would leak
    return clipped, PrivateReply(dp_clipped=float(norm > clip)).to_config()
