"""The layer view of a model, built-in or a user's: its float state as numpy arrays in one
order, and that order grouped by layer (the unit FedRep's head, PLGU's layer scores and
FedAvg's BatchNorm averaging work on).  Below models.py and user_model.py, which both
build on it."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn

#: how many seeded builds a process keeps (built-ins and factories alike)
MAX_BUILT = 4


class NamedLayers(nn.Module):
    """Base: ``layer_names()`` lists the child modules that hold parameters, in order."""

    def layer_names(self) -> list[str]:
        names = []
        for name, module in self.named_modules():
            if name and any(True for _ in module.parameters(recurse=False)):
                names.append(name)
        return names


def _float_items(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(k, v) for k, v in model.state_dict().items() if v.is_floating_point()]


def get_arrays(model: nn.Module) -> list[np.ndarray]:
    """Floating-point state (parameters and float buffers) as numpy arrays, in order."""
    return [v.detach().cpu().numpy().copy() for _, v in _float_items(model)]


def set_arrays(model: nn.Module, arrays: Sequence[np.ndarray]) -> None:
    """Load arrays produced by :func:`get_arrays` (same order) into ``model``."""
    items = _float_items(model)
    if len(items) != len(arrays):
        raise ValueError(f"expected {len(items)} arrays for this model, got {len(arrays)}")
    with torch.no_grad():
        for (name, tensor), array in zip(items, arrays):
            if tuple(tensor.shape) != tuple(np.shape(array)):
                raise ValueError(f"shape mismatch for '{name}': model {tuple(tensor.shape)}, "
                                 f"received {tuple(np.shape(array))}")
            tensor.copy_(torch.as_tensor(np.asarray(array), dtype=tensor.dtype))


def layer_groups(model: NamedLayers) -> list[tuple[str, list[int]]]:
    """``[(layer name, [indices into get_arrays(model)])]`` in ``layer_names()`` order.

    A layer's arrays are the float state_dict entries directly owned by that module
    (``<name>.weight``, ``<name>.bias``, BatchNorm ``<name>.running_mean`` / ``running_var``).
    """
    return _groups(model, model.layer_names())


def head_count(model: nn.Module) -> int:
    """How many of the model's layer groups, the last ones in ``layer_names()`` order, are
    its head (FedRep's h_i, PLGU-GRep's personal part): a user model's declared head
    (``head_groups``, ordered last by :class:`~flower_pfl.learning.user_model.UserModel`),
    one or more layers; 1 for the built-ins (their last layer)."""
    return len(getattr(model, "head_groups", ())) or 1


def head_split(model: NamedLayers) -> tuple[list[int], list[int]]:
    """(head indices, body indices) into ``get_arrays(model)``: the last
    :func:`head_count` layer groups are the head (each with its float buffers, e.g. a
    BatchNorm's running statistics), every other group the body."""
    groups = layer_groups(model)
    count = head_count(model)
    head = [i for _, idx in groups[-count:] for i in idx]
    return head, [i for _, idx in groups[:-count] for i in idx]


def _groups(model: nn.Module, names: Sequence[str]) -> list[tuple[str, list[int]]]:
    keys = [k for k, _ in _float_items(model)]
    groups = []
    for name in names:
        prefix = f"{name}." if name else ""
        idx = [i for i, k in enumerate(keys) if k.startswith(prefix) and "." not in k[len(prefix):]]
        if not idx and name in keys:  # a parameter registered on the root (ScalarModel)
            idx = [keys.index(name)]
        groups.append((name, idx))
    return groups
