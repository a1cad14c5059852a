"""The partitioners' assignments read in one go equal one ``load_partition`` per client.

flower_pfl.learning.partitions.assigned_indices reads the row indices flwr-datasets'
Dirichlet and pathological partitioners keep after their first ``load_partition``, instead
of building a Hugging Face Dataset per client; on real FMNIST labels every client's array
must be the one ``load_partition(i)["idx"]`` gives, in the same order."""

from __future__ import annotations

import numpy as np
import pytest
from datasets import Dataset
from flwr_datasets import partitioner as fp

from flower_pfl.learning import data, partitions


@pytest.fixture(scope="module")
def labels():
    return data.load_pooled("fmnist")[1][:12000]


def fresh(kind: str, n: int, labels: np.ndarray):
    if kind == "iid":
        part = fp.IidPartitioner(num_partitions=n)
    elif kind == "dirichlet":
        part = fp.DirichletPartitioner(num_partitions=n, partition_by="label", alpha=0.3,
                                       min_partition_size=5, self_balancing=False, seed=3)
    else:
        part = fp.PathologicalPartitioner(num_partitions=n, partition_by="label",
                                          num_classes_per_partition=2,
                                          class_assignment_mode="deterministic", seed=3)
    part.dataset = Dataset.from_dict({"label": labels.tolist(),
                                      "idx": np.arange(len(labels)).tolist()})
    return part


@pytest.mark.parametrize("kind", ["dirichlet", "pathological", "iid"])
def test_read_at_once_equals_one_load_per_client(kind, labels):
    n = 37
    slow = fresh(kind, n, labels)
    expected = [np.asarray(slow.load_partition(i)["idx"], dtype=np.int64) for i in range(n)]
    fast = fresh(kind, n, labels)
    first = np.asarray(fast.load_partition(0)["idx"], dtype=np.int64)
    got = [first] + partitions.assigned_indices(fast, first, n)
    assert len(got) == n
    for a, b in zip(got, expected):
        assert a.dtype == np.int64 and np.array_equal(a, b)
    assert len({len(a) for a in got}) > 1 or kind == "iid"  # unequal clients: order matters


def test_the_table_is_read_only_when_it_holds_partition_zero(labels):
    part = fresh("pathological", 10, labels)
    first = np.asarray(part.load_partition(0)["idx"], dtype=np.int64)
    calls: list[int] = []
    load = part.load_partition
    part.load_partition = lambda i: (calls.append(i), load(i))[1]
    partitions.assigned_indices(part, first, 10)
    assert calls == []  # read at once
    partitions.assigned_indices(part, first[:-1], 10)  # not the partition 0 it holds
    assert calls == list(range(1, 10))  # one load_partition per client, as before
