"""Models with named layers: MCLR, DNN (MLP), a small CNN and ResNet-18.

Every model exposes ``layer_names()``: the ordered names of its parameterised layers
(the units PLGU scores and FedRep splits into body/head).  What travels between
server and clients is :func:`get_arrays` -- the floating-point entries of the
state_dict in order (integer buffers such as BatchNorm's step counter stay local).

Layer groups (PLGU's "layers" l = 1..L, FedRep's body/head split): one group per entry
of ``layer_names()``, i.e. per module that holds parameters directly; a group holds that
module's weight and bias (and, for BatchNorm, its running mean/var in the transported
arrays). :func:`layer_groups` maps each group to its indices in :func:`get_arrays`.

=========  ===  ===========================================================
model       L   groups (in order; the last one is FedRep's head)
=========  ===  ===========================================================
mclr        1   fc
dnn         2   fc1, fc2
cnn         4   conv1, conv2, fc1, fc2
resnet18   41   net.conv1, net.bn1, then per block conv1, bn1, conv2, bn2
                (+ downsample.0 conv, downsample.1 bn), ..., net.fc
=========  ===  ===========================================================

Your own model (``model: package.module:factory``, docs/own-model.md) is built by
flower_pfl/learning/user_model.py: the same groups, its declared head -- one layer or
several -- ordered last; :func:`head_count` says how many groups the head is and
:func:`head_split` gives any model's (head, body) arrays.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

# the syntax check of ``model: package.module:factory`` (docs/own-model.md) lives where the
# launcher and the config schema import it without torch
from flower_pfl.factory_ref import check_factory_reference as check_factory_reference

# the layer view every model gives (re-exported: the strategies and clients import it here)
from flower_pfl.learning.layers import MAX_BUILT
from flower_pfl.learning.layers import NamedLayers as NamedLayers
from flower_pfl.learning.layers import get_arrays as get_arrays
from flower_pfl.learning.layers import head_count as head_count
from flower_pfl.learning.layers import head_split as head_split
from flower_pfl.learning.layers import layer_groups as layer_groups
from flower_pfl.learning.layers import set_arrays as set_arrays


class MCLR(NamedLayers):
    """Multinomial logistic regression (pFedMe / pFedBreD's MCLR)."""

    def __init__(self, in_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(int(np.prod(in_shape)), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


class DNN(NamedLayers):
    """Two-layer perceptron: input -> 200 (ReLU) -> classes (pFedMe's DNN shape)."""

    def __init__(self, in_shape: Sequence[int], num_classes: int, hidden: int = 200) -> None:
        super().__init__()
        self.fc1 = nn.Linear(int(np.prod(in_shape)), hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class CNN(NamedLayers):
    """Two 5x5 conv layers (16, 32 channels) with max-pooling, then 128 -> classes.

    Fits 28x28x1 (FMNIST, MNIST, EMNIST) and 32x32x3 (CIFAR) inputs; about 80k
    parameters on FMNIST, small enough for hundreds of CPU clients.
    """

    def __init__(self, in_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        channels, height, _ = in_shape
        self.conv1 = nn.Conv2d(channels, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        side = ((height - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(32 * side * side, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class ResNet18(NamedLayers):
    """torchvision's ResNet-18 with a CIFAR stem (3x3 conv, no max-pool), for GPU runs."""

    def __init__(self, in_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        from torchvision.models import resnet18

        net = resnet18(weights=None, num_classes=num_classes)
        net.conv1 = nn.Conv2d(in_shape[0], 64, 3, 1, 1, bias=False)
        net.maxpool = nn.Identity()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ScalarModel(NamedLayers):
    """One parameter theta (Self-FL's synthetic task): predicts theta for every sample."""

    def __init__(self, in_shape: Sequence[int] = (1,), num_classes: int = 1) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.theta.expand(x.shape[0])

    def layer_names(self) -> list[str]:
        return ["theta"]


MODELS = {"mclr": MCLR, "dnn": DNN, "cnn": CNN, "resnet18": ResNet18, "scalar": ScalarModel}


#: seeded models built once per process, (name, shape, classes, seed) -> the model
_BUILT: dict[tuple[str, tuple[int, ...], int, int], NamedLayers] = {}


def build_model(name: str, in_shape: Sequence[int], num_classes: int, seed: int) -> NamedLayers:
    """Build a model with seeded initial weights (same seed -> same weights everywhere).

    The seeded build runs once per process and (name, shape, classes, seed); every call
    returns a deep copy of it: the same weights, buffers and mode, bit for bit, at a
    fraction of the cost of seeding and initialising (a client builds a model per message).
    The global RNG is untouched either way (the build runs under ``fork_rng``)."""
    if name not in MODELS:
        raise ValueError(f"unknown model '{name}'; allowed: {sorted(MODELS)}")
    key = (name, tuple(int(d) for d in in_shape), int(num_classes), int(seed))
    built = _BUILT.get(key)
    if built is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            built = MODELS[name](in_shape, num_classes)
        if len(_BUILT) >= MAX_BUILT:
            _BUILT.clear()
        _BUILT[key] = built
    return copy.deepcopy(built)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but CUDA is not available on this node")
    return torch.device(name)


def model_for(cfg: Mapping[str, Any], search: Sequence[str | Path] | None = None
              ) -> NamedLayers:
    """The configured model with the run's seeded initial weights: a built-in name, or a
    factory reference ``package.module:factory`` called with ``model-args``
    (``user_model.build_user_model``; ``search``: where to look for its module, by
    default ``user_model.search_dirs(cfg)``).  Raises UserModelError for a factory that
    cannot be used."""
    from flower_pfl.learning.data import NUM_CLASSES, input_shape

    dataset = cfg["data.dataset"]
    if dataset == "synthetic-gaussian":
        return build_model("scalar", (1,), 1, cfg["seed"])
    if dataset == "site":  # per-site data: the declared classes and shape, never a site's
        from flower_pfl.learning import site_data

        site_data.register(cfg)
    name = cfg["model"]
    if is_factory_reference(name):
        from flower_pfl.learning.user_model import build_user_model, model_args, search_dirs

        return build_user_model(name, model_args(cfg), input_shape(dataset),
                                NUM_CLASSES[dataset], cfg["seed"],
                                search_dirs(cfg) if search is None else search)
    return build_model(name, input_shape(dataset), NUM_CLASSES[dataset], cfg["seed"])


def is_factory_reference(name: str) -> bool:
    """Whether a ``model`` value names a factory (``module:factory``), not a built-in."""
    return ":" in name


def initial_arrays(cfg: Mapping[str, Any]) -> list[np.ndarray]:
    """The initial global model every client starts from (same on server and clients)."""
    return get_arrays(model_for(cfg))
