"""The figures a run and a bench write (flower_pfl/reporting/plots.py, results.py, tables.py).

Each figure is drawn from a real in-process run (the real Strategy and ClientApp through
Flower's message path) and inspected as matplotlib drew it, just before it is saved:
integer round ticks, the global model's curve beside the personalized one, a loss panel,
the paper's number on bench curves, and heatmaps that say what and which round they show,
with a two-colour legend for a 0/1 selection and a note naming the clients not trained yet.
"""

from __future__ import annotations

import numpy as np
import pytest

from flower_pfl.reporting import plots
from flower_pfl.reporting.run_files import read_rows, read_summary
from flower_pfl.running import inprocess
from tests.conftest import small_config


@pytest.fixture
def drawn(monkeypatch):
    """Every figure saved, by file name, as it was when saved."""
    figures = {}
    save = plots.save_figure

    def keep(fig, path):
        figures[path.name] = {"axes": fig.axes, "texts": [t.get_text() for t in fig.texts] +
                              [t.get_text() for ax in fig.axes for t in ax.texts],
                              "legends": [t.get_text() for leg in
                                          [ax.get_legend() for ax in fig.axes] + fig.legends
                                          if leg is not None for t in leg.get_texts()]}
        return save(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    return figures


def _tiny(strategy, **changes):
    return small_config(strategy=strategy, model="mclr", **{
        "rounds": 3, "clients": 3, "data.subsample": 1500, "train.batch-size": 50, **changes})


def _integer_ticks(ax):
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    return ticks and all(float(t).is_integer() for t in ticks)


def test_run_curves_have_integer_rounds_the_global_model_and_the_loss(tmp_path, drawn):
    inprocess.run(_tiny("fedavg"), tmp_path)
    fig = drawn["curves.png"]
    acc, loss = fig["axes"]
    assert _integer_ticks(acc) and _integer_ticks(loss)
    labels = [ln.get_label() for ln in acc.lines]
    assert labels == ["personalized mean", "personalized worst-10%", "personalized top-10%",
                      "global model mean"]
    rounds = read_summary(tmp_path)["rounds"]
    glob = next(ln for ln in acc.lines if ln.get_label() == "global model mean")
    assert list(glob.get_ydata()) == pytest.approx([100 * r["global_mean"] for r in rounds])
    assert [ln.get_label() for ln in loss.lines] == ["train", "personalized test"]
    fits = read_rows(tmp_path, "fit")
    first = np.mean([float(r["train_loss"]) for r in fits if r["round"] == "1"])
    assert loss.lines[0].get_ydata()[0] == pytest.approx(first)


def test_every_run_curve_has_its_own_colour_and_a_legend_that_shows_its_dashes(tmp_path, drawn):
    """curves.png: personalized mean, worst-10%, top-10% and global mean in four different
    colours of matplotlib's cycle, four line styles, and legend handles long enough to show a
    dash pattern (a 2-font-size handle shows '--' as one solid stroke)."""
    inprocess.run(_tiny("fedavg", rounds=2), tmp_path)
    acc = drawn["curves.png"]["axes"][0]
    colours = [ln.get_color() for ln in acc.lines]
    assert len(colours) == 4 and len(set(colours)) == 4
    assert set(colours) <= set(plots.cycle_colors())
    assert len({ln.get_linestyle() for ln in acc.lines}) == 4
    legend = acc.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [ln.get_label() for ln in acc.lines]
    assert [h.get_color() for h in legend.legend_handles] == colours
    assert [h.get_linestyle() for h in legend.legend_handles] == [
        ln.get_linestyle() for ln in acc.lines]
    assert legend.handlelength >= 3.5


def test_a_strategy_without_a_global_model_draws_none(tmp_path, drawn):
    inprocess.run(_tiny("local"), tmp_path)
    acc = drawn["curves.png"]["axes"][0]
    assert "global model mean" not in [ln.get_label() for ln in acc.lines]


def test_selection_heatmap_is_binary_titled_and_names_untrained_clients(tmp_path, drawn):
    # 6 clients, 2 trained per round, 2 rounds: at least 2 clients never trained
    inprocess.run(_tiny("fedacs", rounds=2, clients=6, **{"fraction-fit": 0.34,
                                                          "data.subsample": 3000}), tmp_path)
    last = [r for r in read_rows(tmp_path, "clients") if r["round"] == "2"]
    never = sorted(int(r["partition-id"]) for r in last if int(r["fit-rounds"]) == 0)
    assert len(never) >= 2
    sel = drawn["selection.png"]
    assert len(sel["axes"]) == 1  # no colour bar: a 0/1 mask gets a legend
    assert sel["legends"] == ["not selected (0)", "selected (1)"]
    title = sel["axes"][0].get_title()
    assert title.startswith("fedacs: peer selection") and title.endswith("round 2")
    note = " ".join(sel["texts"])
    assert f"{len(never)} of 6 clients not trained yet" in note
    assert ", ".join(map(str, never)) in note
    att = drawn["attention.png"]
    assert len(att["axes"]) == 2 and att["axes"][1].get_ylabel() == "weight xi_ij"
    assert att["axes"][0].get_title().endswith("round 2")


def test_a_dominant_diagonal_does_not_flatten_the_peers_colours(tmp_path, drawn):
    m = np.full((4, 4), 0.02)
    np.fill_diagonal(m, 0.94)
    plots.heatmap(m, tmp_path / "w.png")
    image = drawn["w.png"]["axes"][0].images[0]
    assert image.get_clim() == pytest.approx((0.02, 0.02 + 1e-12), abs=1e-9)
    assert "self-weights 0.94) is above the colour scale" in " ".join(drawn["w.png"]["texts"])


def test_bench_curves_draw_the_papers_number_and_the_global_panel(tmp_path, drawn):
    runs = {"fedavg": [[{"round": 1, "personal_mean": 0.5, "personal_worst10_mean": 0.2,
                         "global_mean": 0.4}, {"round": 2, "personal_mean": 0.6,
                                               "personal_worst10_mean": 0.3,
                                               "global_mean": 0.5}]],
            "local": [[{"round": 1, "personal_mean": 0.7, "personal_worst10_mean": 0.5},
                       {"round": 2, "personal_mean": 0.8, "personal_worst10_mean": 0.6}]]}
    plots.curves(runs, tmp_path / "c.png", paper={"local": 75.98},
                 paper_global={"fedavg": 69.1}, paper_label="compare with our BMTA")
    mean, worst, glob = drawn["c.png"]["axes"]
    assert [ax.get_title() for ax in (mean, worst, glob)] == [
        "personalized mean", "personalized worst-10%", "global model mean"]
    assert all(_integer_ticks(ax) for ax in (mean, worst, glob))
    flat = [ln for ln in mean.lines if len(set(ln.get_ydata())) == 1 and ln.get_linestyle() == ":"]
    assert [ln.get_ydata()[0] for ln in flat] == [75.98]
    assert [ln.get_ydata()[0] for ln in glob.lines if ln.get_linestyle() == ":"] == [69.1]
    assert "paper's number (compare with our BMTA)" in drawn["c.png"]["legends"]


def test_a_weight_matrix_of_zeros_and_ones_keeps_its_colour_bar(tmp_path, drawn):
    """Every client weighting only itself gives an identity matrix: still weights (a colour
    bar), not a selection legend; a selection mask gets the legend."""
    plots.heatmap(np.eye(3), tmp_path / "w.png", binary=False)
    plots.heatmap(np.eye(3), tmp_path / "s.png", binary=True)
    assert len(drawn["w.png"]["axes"]) == 2 and not drawn["w.png"]["legends"]
    assert len(drawn["s.png"]["axes"]) == 1 and drawn["s.png"]["legends"]
