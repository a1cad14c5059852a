"""The local train/test split per class (``data.split: stratified``, the default) and the
old random split, bit for bit (issue 50)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flower_pfl.learning import data, partitions, splits
from tests.conftest import small_config


def test_quota_by_hand():
    # n = 12, T = round(3) = 3; exact 2, 0.75, 0.25 -> floors 2, 0, 0, the one left to
    # class 1 (largest remainder)
    assert splits.quota_per_class(np.array([8, 3, 1]), 0.25).tolist() == [2, 1, 0]
    # n = 7, T = round(3.5) = 4; exact 8/7 x3, 4/7 -> 1,1,1,0 + the one left to class 3,
    # whose single sample stays in training (cap n_c - 1): 1,1,1,0
    assert splits.quota_per_class(np.array([2, 2, 2, 1]), 0.5).tolist() == [1, 1, 1, 0]
    # every class a singleton: one test sample all the same (the largest, first)
    assert splits.quota_per_class(np.array([1, 1]), 0.25).tolist() == [1, 0]
    # n = 8, T = 6; exact 1.5, 4.5 -> 1, 4 + one to class 0 (tie: lower), capped at 1;
    # what the cap took goes to class 1: never both of class 0's samples to the test set
    assert splits.quota_per_class(np.array([2, 6]), 0.75).tolist() == [1, 5]


def test_the_leftover_spreads_by_largest_remainder_and_the_total_rounds_to_nearest():
    """Issue 67: n = 20, T = round(6) = 6; exact 1.5 each -> floors 1, 1, 1, 1 and the two
    left over one each to classes 0 and 1 (ties: the lower), not both to one class
    ([3, 1, 1, 1])."""
    assert splits.quota_per_class(np.array([5, 5, 5, 5]), 0.3).tolist() == [2, 2, 1, 1]
    # n = 7, T = round(3.5) = 4 (not floor: 3); exact 16/7, 12/7 -> 2, 1 + the one left
    # to class 1 (remainder 5/7 > 2/7): [2, 2], where a total of 3 gives [2, 1]
    assert splits.quota_per_class(np.array([4, 3]), 0.5).tolist() == [2, 2]


def test_split_local_takes_the_first_of_each_class_in_shuffled_order():
    shuffled = np.array([50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61])
    labels = np.array([2, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0])  # 8 x 0, 3 x 1, 1 x 2
    train, test = splits.split_local(shuffled, labels, 0.25, "stratified")
    assert sorted(test.tolist()) == [51, 52, 53]  # the first two 0s, the first 1; no 2
    assert train.tolist() == [50, 54, 55, 56, 57, 58, 59, 60, 61]  # the rest, in order
    train, test = splits.split_local(shuffled, labels, 0.25, "random")
    assert test.tolist() == [50, 51, 52] and train.tolist() == shuffled[3:].tolist()


def test_make_partition_splits_every_client_per_class():
    labels = np.repeat([0, 1, 2], [30, 9, 3])  # asymmetric classes
    cfg = small_config(clients=2, **{"data.partition": "iid", "data.subsample": None}).values
    part = partitions.make_partition(labels, cfg)
    for tr, te in zip(part.train, part.test):
        counts = np.bincount(labels[np.concatenate([tr, te])], minlength=3)
        assert np.bincount(labels[te], minlength=3).tolist() == \
            splits.quota_per_class(counts, 0.25).tolist()
        assert not set(tr) & set(te)
    assert splits.unseen_test_classes(part.train, part.test, labels) == {}


@pytest.fixture(scope="module")
def fmnist_labels():
    return np.asarray(data.load_pooled("fmnist")[1])


def test_the_issue_case_random_tests_unseen_classes_stratified_none(fmnist_labels):
    """Issue 50: 20 clients of a 3,000 subsample: the random split gives clients test
    samples of classes they never train on; the per-class split none."""
    base = {"clients": 20, "data.subsample": 3000}
    rand = small_config(**base, **{"data.split": "random"}).values
    strat = small_config(**base).values
    assert strat["data.split"] == "stratified"  # the default
    unseen = splits.unseen_test_classes(*_parts(rand, fmnist_labels), fmnist_labels)
    assert len(unseen) >= 3
    assert splits.unseen_test_classes(*_parts(strat, fmnist_labels), fmnist_labels) == {}
    assert partitions.unseen_count(rand) == len(unseen)  # the summary's number
    assert partitions.unseen_count(strat) == 0


def _parts(cfg, labels):
    part = partitions.make_partition(labels, cfg)
    return part.train, part.test


def _old_make_partition(labels, cfg):
    """make_partition's split before data.split (main 98037d0), for the bit-for-bit check."""
    rng = np.random.default_rng([cfg["seed"], 0x5EED])
    pool = np.sort(rng.choice(len(labels), cfg["data.subsample"], replace=False))
    parts = partitions._flwr_partition(labels[pool], cfg, cfg["seed"], len(labels))
    train, test = [], []
    for local in parts:
        local = pool[rng.permutation(local)]
        n_test = max(1, int(round(len(local) * cfg["data.test-fraction"])))
        train.append(np.sort(local[n_test:][:cfg["data.max-train-samples"]]))
        test.append(np.sort(local[:n_test]))
    return train, test


@pytest.mark.parametrize("more", [{}, {"data.partition": "pathological"},
                                  {"data.max-train-samples": 50}])
def test_random_split_is_the_old_split_bit_for_bit(fmnist_labels, more):
    cfg = small_config(**{"data.split": "random", **more}).values
    part = partitions.make_partition(fmnist_labels, cfg)
    old_train, old_test = _old_make_partition(fmnist_labels, cfg)
    assert all(np.array_equal(a, b) for a, b in zip(part.train, old_train))
    assert all(np.array_equal(a, b) for a, b in zip(part.test, old_test))
    strat = partitions.make_partition(fmnist_labels, dict(cfg, **{"data.split": "stratified"}))
    # the same clients' samples, split otherwise
    assert all(np.array_equal(np.sort(np.concatenate([a, b])), np.sort(np.concatenate([c, d])))
               for a, b, c, d in zip(part.train, part.test, strat.train, strat.test)
               ) or more.get("data.max-train-samples")
    assert any(not np.array_equal(a, b) for a, b in zip(part.test, strat.test))


def test_a_bad_split_value_is_refused_naming_the_key():
    from flower_pfl import config

    with pytest.raises(config.ConfigError, match="data.split"):
        small_config(**{"data.split": "per-class"})


def test_the_run_summary_counts_the_clients_testing_on_unseen_classes(fmnist_labels, tmp_path):
    """Each client reports its unseen classes when it evaluates; summary.json counts the
    clients with any: the partition's own count under the random split, 0 stratified."""
    from flower_pfl.running import inprocess

    base = {"strategy": "local", "clients": 20, "rounds": 1, "model": "mclr",
            "data.subsample": 3000}
    rand = small_config(**base, **{"data.split": "random"})
    expected = len(splits.unseen_test_classes(*_parts(rand.values, fmnist_labels),
                                              fmnist_labels))
    assert expected >= 3
    inprocess.run(rand, tmp_path / "random")
    assert json.loads((tmp_path / "random" / "summary.json").read_text())[
        splits.UNSEEN_KEY] == expected
    inprocess.run(small_config(**base), tmp_path / "stratified")
    assert json.loads((tmp_path / "stratified" / "summary.json").read_text())[
        splits.UNSEEN_KEY] == 0
    assert splits.unseen_classes(np.array([0, 0, 2]), np.array([1, 2, 3, 3])) == 2
