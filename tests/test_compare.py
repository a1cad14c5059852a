"""``flower-pfl compare`` (flower_pfl/reporting/compare.py) on real tiny in-process runs.

The table's rows are the runs' summary.json numbers, the curves the runs' round rows; a
folder that is not a run, an unfinished run, a metric some run did not record and runs of
an accuracy beside runs of an error are refused with the cause named and nothing written;
labels say what tells the runs apart.
"""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from flower_pfl.cli import main
from flower_pfl.reporting import compare as cmp
from flower_pfl.reporting.run_files import read_summary
from flower_pfl.running import inprocess
from tests.conftest import small_config
from tests.test_plots import drawn  # noqa: F401 - the fixture: figures as drawn


def _tiny(strategy, **changes):
    return small_config(strategy=strategy, model="mclr", **{
        "rounds": 2, "clients": 3, "data.subsample": 1500, "train.batch-size": 50, **changes})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three finished runs (fedavg has a global model, fedamp and local none) and fedavg
    again on another seed."""
    root = tmp_path_factory.mktemp("runs")
    made = {}
    for name, cfg in (("fedavg", _tiny("fedavg")), ("fedamp", _tiny("fedamp")),
                      ("local", _tiny("local")), ("fedavg-s1", _tiny("fedavg", seed=1))):
        inprocess.run(cfg, root / name)
        assert read_summary(root / name)["status"] == "completed"
        made[name] = root / name
    return made


def _csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_table_rows_are_the_runs_summaries_and_curves_their_rounds(runs, tmp_path, drawn):  # noqa: F811
    three = [runs["fedavg"], runs["fedamp"], runs["local"]]
    result = cmp.compare(three, tmp_path / "out")
    rows = _csv(tmp_path / "out" / "table.csv")
    assert [r["label"] for r in rows] == ["fedavg", "fedamp", "local"]  # strategy only differs
    for row, run in zip(rows, three):
        summary = read_summary(run)
        final = summary["final"]
        assert float(row["final_mean"]) == pytest.approx(100 * final["personal_mean"])
        assert float(row["final_worst10"]) == pytest.approx(100 * final["personal_worst10_mean"])
        assert float(row["final_weighted"]) == pytest.approx(
            100 * final["personal_weighted_mean"])
        assert float(row["bmta"]) == pytest.approx(100 * summary["bmta"])
        if "global_mean" in final:
            assert float(row["global_final"]) == pytest.approx(100 * final["global_mean"])
        else:
            assert row["global_final"] == ""
        assert row["dir"] == str(run) and row["rounds"] == "2.0"
    assert rows[0]["global_final"] != "" and rows[2]["global_final"] == ""
    md = result.table
    local = read_summary(runs["local"])["final"]
    assert (f"| local | 2/2 | {100 * local['personal_mean']:.2f} | "
            f"{100 * local['personal_weighted_mean']:.2f} | ") in md
    assert "Differs between the runs: the strategy only" in md and "`clients=3`" in md
    png = tmp_path / "out" / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "out" / "clients.png").is_file()
    mean, worst, glob = drawn["curves.png"]["axes"]
    assert [ax.get_title() for ax in (mean, worst, glob)] == [
        "personalized mean", "personalized worst-10%", "global model mean"]
    for line, run in zip(mean.lines, three):
        assert list(line.get_ydata()) == pytest.approx(
            [100 * r["personal_mean"] for r in read_summary(run)["rounds"]])
    assert len({ln.get_color() for ln in mean.lines}) == 3
    assert drawn["curves.png"]["legends"] == ["fedavg", "fedamp", "local"]


def test_the_command_prints_the_table_and_writes_the_figures(runs, tmp_path, capsys):
    out = tmp_path / "c"
    assert main(["compare", str(runs["fedavg"]), str(runs["local"]), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# Comparison of 2 runs") and "| fedavg | 2/2 |" in printed
    assert f"written to {out}/: table.md, table.csv, curves.png, clients.png" in printed


def test_a_metric_outside_the_bench_columns_gets_a_column_and_a_panel(runs, tmp_path, drawn):  # noqa: F811
    cmp.compare([runs["fedamp"], runs["local"]], tmp_path / "o",
                metrics=["personal_std", "personal_mean"])
    rows = _csv(tmp_path / "o" / "table.csv")
    for row, name in zip(rows, ("fedamp", "local")):
        final = read_summary(runs[name])["final"]
        assert float(row["personal_std"]) == pytest.approx(100 * final["personal_std"])
    assert "| final personal_std |" in (tmp_path / "o" / "table.md").read_text()
    assert [ax.get_title() for ax in drawn["curves.png"]["axes"]] == [
        "personal_std", "personalized mean"]


def test_labels_name_what_differs_between_runs(runs, tmp_path):
    done = cmp.load_runs([runs["fedavg"], runs["fedavg-s1"], runs["local"]])
    assert [r.label for r in done] == ["fedavg seed=0", "fedavg seed=1", "local seed=0"]
    # a hyper-parameter tells apart runs of the same strategy only
    other = tmp_path / "fedamp-b"
    shutil.copytree(runs["fedamp"], other)
    conf = json.loads((other / "config.json").read_text())
    conf["hyper"]["lambda"] = 2 * conf["hyper"]["lambda"]
    (other / "config.json").write_text(json.dumps(conf))
    lam = json.loads((runs["fedamp"] / "config.json").read_text())["hyper"]["lambda"]
    done = cmp.load_runs([runs["fedamp"], other, runs["local"]])
    assert [r.label for r in done] == [f"fedamp hyper.lambda={lam}",
                                       f"fedamp hyper.lambda={2 * lam}", "local"]
    # the same configuration twice: the folder's name tells them apart
    twin = tmp_path / "again"
    shutil.copytree(runs["local"], twin)
    done = cmp.load_runs([runs["local"], twin])
    assert [r.label for r in done] == ["local (local)", "local (again)"]


def test_a_folder_that_is_not_a_run_is_refused_naming_the_runs_inside(runs, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    parent = runs["fedavg"].parent
    out = tmp_path / "never"
    assert main(["compare", str(runs["fedavg"]), str(empty), str(parent), "--out",
                 str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{empty}: not a run folder (no summary.json" in err
    assert f"{parent}: not a run folder" in err and "it holds 4 run folder(s)" in err
    assert not out.exists()  # nothing written
    with pytest.raises(cmp.CompareError, match="given more than once"):
        cmp.load_runs([runs["fedavg"], runs["fedavg"]])


def test_an_unfinished_run_is_refused_unless_allowed_then_compared_at_its_last_round(
        runs, tmp_path):
    stopped = tmp_path / "stopped"
    shutil.copytree(runs["fedamp"], stopped)
    summary = read_summary(stopped)
    first = summary["rounds"][0]  # stopped after round 1 of 2
    summary.update(status="stopped", rounds=[first],
                   final={k: v for k, v in first.items() if k != "round"})
    (stopped / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(cmp.CompareError) as info:
        cmp.compare([runs["local"], stopped], tmp_path / "no")
    assert "not a finished run: status 'stopped' after round 1 of 2" in str(info.value)
    assert "--allow-unfinished" in str(info.value) and not (tmp_path / "no").exists()
    result = cmp.compare([runs["local"], stopped], tmp_path / "yes", allow_unfinished=True)
    row = _csv(tmp_path / "yes" / "table.csv")[1]
    assert float(row["final_mean"]) == pytest.approx(100 * first["personal_mean"])
    assert row["unfinished"].startswith("status 'stopped'")
    assert "| 1/2 (stopped) |" in result.table


def test_a_metric_some_run_did_not_record_is_refused(runs, tmp_path):
    with pytest.raises(cmp.CompareError) as info:
        cmp.compare([runs["fedavg"], runs["local"]], tmp_path / "x", metrics=["global_mean"])
    msg = str(info.value)
    assert "metric 'global_mean' is not recorded by local (no global model)" in msg
    assert "metrics every run recorded: personal_mean," in msg
    assert "global_mean" not in msg.split("recorded:")[-1]
    with pytest.raises(cmp.CompareError, match=r"unknown metric 'personal_worst10' \(did you "
                       r"mean 'personal_worst10_mean'\?\)"):
        cmp.compare([runs["fedavg"]], tmp_path / "x", metrics=["personal_worst10"])
    assert not (tmp_path / "x").exists()


def test_an_error_metric_is_not_compared_with_an_accuracy(runs, tmp_path):
    mse = tmp_path / "mse"
    inprocess.run(small_config(strategy="fedavg", rounds=2, clients=3, model="scalar",
                               **{"data.dataset": "synthetic-gaussian", "train.lr": 0.01}), mse)
    with pytest.raises(cmp.CompareError) as info:
        cmp.compare([runs["fedavg"], mse], tmp_path / "x")
    assert (f"runs of different metrics: accuracy (higher is better): {runs['fedavg']}; "
            f"mse (lower is better): {mse}") in str(info.value)
    result = cmp.compare([mse], tmp_path / "ok")  # alone it is compared, as an error
    assert "(an error: lower is better)" in result.table
    row = _csv(tmp_path / "ok" / "table.csv")[0]
    assert float(row["final_mean"]) == pytest.approx(read_summary(mse)["final"]["personal_mean"])
