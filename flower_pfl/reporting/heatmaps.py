"""What a saved matrix is and how its heatmap is drawn: the ground-truth client groups of a
practical partition, the title and colour-bar label per matrix name, and the PNG itself
(matplotlib through :func:`flower_pfl.reporting.plots.heatmap`, imported when one is drawn).
Used by a run's :class:`~flower_pfl.reporting.results.ResultsWriter` and the bench tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np


def true_groups(values: Mapping[str, Any]) -> list[int] | None:
    """The partition's ground-truth client groups (FedAMP practical), else None."""
    if values.get("data.partition") != "practical":
        return None
    from flower_pfl.learning.partitions import group_of_clients

    return group_of_clients(int(values["clients"]), int(values["data.groups"])).tolist()


def write_heatmap_png(path: Path, matrix: np.ndarray, groups: Sequence[int] | None = None,
                      title: str = "", untrained: Sequence[int] = ()) -> None:
    """Write ``matrix`` as a heatmap PNG (matplotlib, :func:`~.plots.heatmap`)."""
    from flower_pfl.reporting import plots

    name = Path(path).stem.split("-")[-1]
    plots.heatmap(np.asarray(matrix, dtype=np.float64), Path(path), title=title, groups=groups,
                  untrained=untrained, label=MATRIX_LABELS.get(name, "weight"),
                  binary=MATRIX_BINARY.get(name))


# what a saved matrix is (save_matrix's name -> its heatmap's title and colour-bar label)
MATRIX_TITLES = {
    "attention": "aggregation weights xi_ij (row i: weight of client j's model in u_i)",
    "selection": "peer selection 1[xi_ij > 0] (row i: models client i aggregates)",
}
MATRIX_LABELS = {"attention": "weight xi_ij"}
# a selection is a 0/1 mask (a legend); weights keep a colour bar even when all 0 or 1
MATRIX_BINARY = {"selection": True, "attention": False}


def matrix_title(name: str, strategy: str, server_round: int | None, extra: str = "") -> str:
    """A heatmap's title: which strategy, what the matrix is, which round."""
    what = MATRIX_TITLES.get(name, name)
    when = f", round {server_round}" if server_round is not None else ""
    return f"{strategy}: {what}{when}{extra}"
