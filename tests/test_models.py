"""Models: named layers (PLGU/FedRep need them), the head split, array transport, devices."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flower_pfl.learning.models import (
    build_model,
    check_factory_reference,
    get_arrays,
    head_split,
    is_factory_reference,
    resolve_device,
    set_arrays,
)


@pytest.mark.parametrize("name, layers", [("mclr", ["fc"]), ("dnn", ["fc1", "fc2"]),
                                          ("cnn", ["conv1", "conv2", "fc1", "fc2"])])
def test_named_layers_and_forward(name, layers):
    model = build_model(name, (1, 28, 28), 10, seed=0)
    assert model.layer_names() == layers
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_cnn_fits_cifar_shape_and_seed_fixes_weights():
    cnn = build_model("cnn", (3, 32, 32), 10, seed=1)
    assert cnn(torch.zeros(1, 3, 32, 32)).shape == (1, 10)
    same = build_model("cnn", (3, 32, 32), 10, seed=1)
    other = build_model("cnn", (3, 32, 32), 10, seed=2)
    assert all(np.array_equal(a, b) for a, b in zip(get_arrays(cnn), get_arrays(same)))
    assert not np.array_equal(get_arrays(cnn)[0], get_arrays(other)[0])


def test_array_round_trip_and_shape_errors():
    a, b = build_model("dnn", (1, 28, 28), 10, 0), build_model("dnn", (1, 28, 28), 10, 5)
    set_arrays(b, get_arrays(a))
    assert all(np.array_equal(x, y) for x, y in zip(get_arrays(a), get_arrays(b)))
    with pytest.raises(ValueError, match="expected 4 arrays"):
        set_arrays(b, get_arrays(a)[:2])
    with pytest.raises(ValueError, match="shape mismatch"):
        set_arrays(b, [np.zeros((3, 3))] + get_arrays(a)[1:])


def test_device_selection():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            resolve_device("cuda")


@pytest.mark.parametrize("name, head", [("mclr", ["fc.weight", "fc.bias"]),
                                        ("dnn", ["fc2.weight", "fc2.bias"]),
                                        ("cnn", ["fc2.weight", "fc2.bias"])])
def test_the_builtins_head_is_their_last_layer(name, head):
    model = build_model(name, (1, 28, 28), 10, seed=0)
    keys = [k for k, v in model.state_dict().items() if v.is_floating_point()]
    head_idx, body_idx = head_split(model)
    assert [keys[i] for i in head_idx] == head
    assert sorted(head_idx + body_idx) == list(range(len(keys)))


def test_a_factory_reference_is_told_from_a_builtin_name_without_importing_it():
    assert not is_factory_reference("cnn") and is_factory_reference("nowhere_xyz:make")
    assert check_factory_reference("nowhere_xyz.sub:make") is None  # syntax only
    assert "is not a factory reference" in check_factory_reference("nowhere_xyz:")
