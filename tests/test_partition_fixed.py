"""The ``natural`` (a column names the client) and ``file`` (the user's lists) partitions,
and each mistake in a partition file refused before start, naming its key (issue 50)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flower_pfl import config
from flower_pfl.learning import data, own_data, partitions
from flower_pfl.reliability import preflight as pf
from tests.test_data_sources import make_csv, make_imagefolder, own_config


def _load(cfg):
    return data.load_pooled(cfg["data.dataset"], cfg["data.root"], cfg["cache-dir"],
                            own_data.settings_of(cfg))


def test_natural_partition_gives_each_site_its_rows(tmp_path):
    frame = make_csv(tmp_path / "t.csv")
    cfg = own_config(str(tmp_path / "t.csv"), tmp_path, clients=4,
                     **{"data.label": "kind", "data.partition": "natural",
                        "data.partition-by": "site"}).values
    _, y = _load(cfg)
    part = partitions.get_partition(cfg, y)
    for client, site in enumerate("abcd"):  # sorted site names -> clients 0..3
        rows = np.sort(np.concatenate([part.train[client], part.test[client]]))
        assert rows.tolist() == np.flatnonzero(frame["site"].to_numpy() == site).tolist()
    x, _ = _load(cfg)
    assert x.shape == (60, 3)  # the site column is no feature


def test_natural_partition_with_other_clients_is_refused_naming_both_keys(tmp_path):
    make_csv(tmp_path / "t.csv")
    cfg = own_config(str(tmp_path / "t.csv"), tmp_path, clients=3,
                     **{"data.label": "kind", "data.partition": "natural",
                        "data.partition-by": "site"})
    with pytest.raises(pf.PreflightError, match=r"'data.partition-by' names 4 distinct clients "
                       r"but 'clients' = 3; set clients: 4"):
        pf.preflight(cfg)
    bad = own_config(str(tmp_path / "t.csv"), tmp_path, clients=4,
                     **{"data.label": "kind", "data.partition": "natural",
                        "data.partition-by": "hospital"})
    with pytest.raises(pf.PreflightError, match=r"'data.partition-by' = 'hospital': no such"):
        pf.preflight(bad)


@pytest.mark.parametrize("more, match", [
    ({"data.partition": "natural"}, "needs 'data.partition-by'"),
    ({"data.partition": "file"}, "needs 'data.partition-file'"),
    ({"data.partition-by": "site"}, "'data.partition-by' = 'site' is read by the natural"),
    ({"data.partition": "file", "data.partition-file": "p.json", "data.subsample": 30},
     "'data.subsample' = 30 does not apply"),
])
def test_partition_keys_that_nothing_reads_are_refused(tmp_path, more, match):
    make_csv(tmp_path / "t.csv")
    with pytest.raises(config.ConfigError, match=match):
        own_config(str(tmp_path / "t.csv"), tmp_path, **{"data.label": "kind", **more})


def _file_config(tmp_path, doc, clients=3, suffix=".json"):
    root = make_imagefolder(tmp_path / "imgs")  # 18 images: rows 0..17
    path = tmp_path / f"parts{suffix}"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return own_config(str(root), tmp_path, clients=clients,
                      **{"data.partition": "file", "data.partition-file": str(path)})


def test_file_partition_json_and_csv_by_index_and_by_path(tmp_path):
    lists = [[0, 1, 2, 5, 6, 7], [3, 4, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17]]
    cfg = _file_config(tmp_path, {"clients": lists}).values
    _, y = _load(cfg)
    part = partitions.get_partition(cfg, y)
    got = [sorted(np.concatenate([a, b]).tolist()) for a, b in zip(part.train, part.test)]
    assert got == lists
    rows = "client,index\n" + "".join(f"{c},{i}\n" for c, li in enumerate(lists) for i in li)
    cfg = _file_config(tmp_path, rows, suffix=".csv").values
    part = partitions.get_partition(cfg, y)
    assert [sorted(np.concatenate([a, b]).tolist()) for a, b in
            zip(part.train, part.test)] == got
    ids = "client,id\n0,class0/000.png\n0,class1/000.png\n0,class1/001.png\n" \
          "1,class2/000.png\n1,class2/001.png\n"
    cfg = _file_config(tmp_path, ids, clients=2, suffix=".csv").values
    part = partitions.get_partition(cfg, y)
    assert [sorted(np.concatenate([a, b]).tolist()) for a, b in
            zip(part.train, part.test)] == [[0, 5, 6], [14, 15]]


@pytest.mark.parametrize("doc, match", [
    ({"clients": [[0, 1], [2, 3], [4, 99]]}, r"client 2 lists row\(s\) \[99\] outside the "
                                             r"data's 0..17"),
    ({"clients": [[0, 1], [2, 3], [-1, 4]]}, r"client 2 lists row\(s\) \[-1\]"),
    ({"clients": [[0, 1], [1, 3], [4, 5]]}, r"sample 1 is in clients 0 and 1"),
    ({"clients": [[0, 1], [2, 3], []]}, r"client 2 has no samples"),
    ({"clients": [[0, 1], [2, 3]]}, r"clients \[2\] missing"),
    ({"0": [0, 1], "1": [2, 3], "2": [4, 5], "3": [6, 7]}, r"clients \[3\] outside 0..2"),
    ({"clients": [[0, 0, 1], [2, 3], [4, 5]]}, r"client 0 lists a sample twice"),
    ({"clients": [[0, "a"], [2, 3], [4, 5]]}, r"must be a list of integer row indices"),
    ("{not json", r"cannot be read as JSON"),
])
def test_each_partition_file_mistake_is_refused_naming_the_key(tmp_path, doc, match):
    cfg = _file_config(tmp_path, doc)
    with pytest.raises(pf.PreflightError, match=r"'data.partition-file'.*" + match):
        pf.preflight(cfg)


def test_overlap_is_allowed_where_the_file_says_so(tmp_path):
    cfg = _file_config(tmp_path, {"overlap": True,
                                  "clients": [[0, 1, 2, 3], [2, 3, 4, 5], [6, 7, 8, 9]]}).values
    _, y = _load(cfg)
    part = partitions.get_partition(cfg, y)
    assert sorted(np.concatenate([part.train[1], part.test[1]]).tolist()) == [2, 3, 4, 5]


def _natural_rows(part):
    return [sorted(np.concatenate([a, b]).tolist()) for a, b in zip(part.train, part.test)]


def test_ten_or_more_integer_ids_are_clients_in_numeric_order():
    """Issue 67: ids 1..12 (id 2 twice): client 1 is id 2 (rows 1, 12), client 9 is id 10
    (row 0) -- as text, "10" would sort before "2" and client 1 would be id 10."""
    ids = np.array([10, 2, 1, 12, 3, 4, 5, 6, 7, 8, 9, 11, 2])
    from flower_pfl.learning import fixed_partitions as fp

    parts = [p.tolist() for p in fp.natural_partition(ids, 12, "data.partition-by")]
    assert parts[0] == [2] and parts[1] == [1, 12] and parts[9] == [0] and parts[11] == [3]


def test_float_ids_of_a_csv_sort_as_numbers_and_missing_ids_are_counted(tmp_path):
    """A site column with a gap is read as floats (1.0, 10.0, 2.0): clients in numeric
    order; an empty id is refused with the count of such rows, not run as a client 'nan'."""
    frame = make_csv(tmp_path / "t.csv", n=33)
    frame["site"] = np.array([1.0, 10.0, 2.0])[np.arange(33) % 3]
    frame.to_csv(tmp_path / "t.csv", index=False)
    cfg = own_config(str(tmp_path / "t.csv"), tmp_path, clients=3,
                     **{"data.label": "kind", "data.partition": "natural",
                        "data.partition-by": "site"}).values
    _, y = _load(cfg)
    got = _natural_rows(partitions.get_partition(cfg, y))
    assert got == [list(range(0, 33, 3)), list(range(2, 33, 3)), list(range(1, 33, 3))]
    frame["site"] = frame["site"].astype(object)
    frame.loc[[4, 17], "site"] = None
    frame.to_csv(tmp_path / "gaps.csv", index=False)
    for clients in (3, 4):  # with or without "nan" counted as a client
        bad = own_config(str(tmp_path / "gaps.csv"), tmp_path, clients=clients,
                         **{"data.label": "kind", "data.partition": "natural",
                            "data.partition-by": "site"})
        with pytest.raises(pf.PreflightError, match=r"'data.partition-by': 2 of 33 rows have "
                           r"no client id \(empty or NaN; rows \[4, 17\]\)"):
            pf.preflight(bad)


def test_text_ids_with_empty_entries_and_fractional_ids():
    from flower_pfl.learning import fixed_partitions as fp

    with pytest.raises(data.DataError, match=r"1 of 4 rows have no client id .*rows \[2\]"):
        fp.natural_ids(np.array(["b", "a", "", "a"]), "data.partition-by")
    assert fp.natural_ids(np.array([0.5, 10.25, 2.0]), "k").tolist() == [0.5, 10.25, 2.0]
    parts = fp.natural_partition(np.array([0.5, 10.25, 2.0, 0.5]), 3, "k")
    assert [p.tolist() for p in parts] == [[0, 3], [2], [1]]
