"""A model factory for tests that run many short federations (``model:
tests.tiny_model:mlp``): 784 -> ``hidden`` (ReLU) -> 10, two layers like the built-in DNN
(so FedRep has a body and a head, PLGU-LF a personal and a shared layer) at 1/25 of its
size (``hidden`` 8: 6,370 parameters against 159,010)."""

from __future__ import annotations

from torch import nn


def mlp(hidden: int = 8, classes: int = 10) -> nn.Module:
    """``nn.Sequential(Flatten, Linear(784, hidden), ReLU, Linear(hidden, classes))`` for
    28x28x1 inputs (FMNIST); its last layer is the head (the default split)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(),
                         nn.Linear(hidden, classes))
