"""FedBN's split of a model (Li et al., ICLR 2021, Algorithm 1): which of the arrays that
travel (``learning.layers.get_arrays``: the float state_dict entries in order) belong to a
BatchNorm layer and therefore never leave the client.

Algorithm 1 averages "every layer that is not BatchNorm" and keeps each client's BatchNorm
layers -- section 3 names their affine parameters (scale and shift) and their running mean
and variance; both stay local.  The paper leaves open what a BatchNorm layer is in a model
of one's own: here every module of the ``torch.nn.modules.batchnorm._BatchNorm`` family
(BatchNorm1d/2d/3d, SyncBatchNorm, their lazy forms), with or without affine parameters.
Integer buffers (``num_batches_tracked``) never travel at all.

Imports torch: a strategy calls it inside a method, never at import.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def batchnorm_indices(model: nn.Module) -> list[int]:
    """Indices into ``get_arrays(model)`` of every BatchNorm module's float state (weight,
    bias, running_mean, running_var; those it has), ascending; [] for a model without
    BatchNorm."""
    keys = [k for k, v in model.state_dict().items() if v.is_floating_point()]
    prefixes = tuple(f"{name}." for name, m in model.named_modules() if isinstance(m, _BatchNorm))
    return [i for i, k in enumerate(keys)
            if any(k.startswith(p) and "." not in k[len(p):] for p in prefixes)]
