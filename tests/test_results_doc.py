"""docs/RESULTS.md's embedded tables are the matrices' table.md tables (embed_tables.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


embed = _load("embed_tables")

TABLE_MD = """# m

## s1

Some words.

| strategy | mean |
|---|---|
| a | 1.00 |
| b | 2.00 |

After the table.

## Paired comparisons

### s1

| A − B | compared | verdict |
|---|---|---|
| a − b | final mean (personalized) | not resolved at 3 seeds (±1.25) |
| a − b | worst-10% (personalized) | holds |

### s2

| A − B | compared | verdict |
|---|---|---|
| c − d | final mean (personalized) | holds |
"""


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    (tmp_path / "docs/results/m").mkdir(parents=True)
    (tmp_path / "docs/results/m/table.md").write_text(TABLE_MD)
    return tmp_path


def _doc(body_a: str, body_b: str) -> str:
    return ("# Results\n\nprose\n\n"
            "<!-- table: docs/results/m/table.md#m/s1 -->\n" + body_a +
            "<!-- /table -->\n\nmore prose\n\n"
            "<!-- table: docs/results/m/table.md#Paired comparisons/s1 | match=final mean -->\n"
            + body_b + "<!-- /table -->\n\nend\n")


def test_a_stale_block_is_rewritten_and_a_second_run_changes_nothing(tree: Path):
    stale = _doc("| strategy | mean |\n|---|---|\n| a | 0.99 |\n", "")
    assert embed.stale_blocks(stale, tree) == [
        "line 5: docs/results/m/table.md#m/s1",
        "line 13: docs/results/m/table.md#Paired comparisons/s1"]
    once = embed.render(stale, tree)
    assert once == _doc("| strategy | mean |\n|---|---|\n| a | 1.00 |\n| b | 2.00 |\n",
                        "| A − B | compared | verdict |\n|---|---|---|\n"
                        "| a − b | final mean (personalized) | not resolved at 3 seeds (±1.25) |\n")
    assert embed.render(once, tree) == once
    assert embed.stale_blocks(once, tree) == []
    # the prose around the blocks is kept as it was
    assert once.startswith("# Results\n\nprose\n\n") and once.endswith("\n\nend\n")


def test_the_selector_takes_the_heading_under_its_parent_not_the_first_of_its_name(tree: Path):
    text = (tree / "docs/results/m/table.md").read_text()
    assert embed.select_table(text, "m/s1")[2] == "| a | 1.00 |"
    assert embed.select_table(text, "Paired comparisons/s1")[2].startswith("| a − b | final")
    assert embed.select_table(text, "s2")[2].startswith("| c − d")
    with pytest.raises(embed.EmbedError, match="ambiguous"):
        embed.select_table(text, "s1")
    with pytest.raises(embed.EmbedError, match="no heading 'nope'"):
        embed.select_table(text, "nope")
    with pytest.raises(embed.EmbedError, match="matches"):
        embed.select_table(text, "s2", match="worst")


def test_markers_that_cannot_be_resolved_say_what_to_fix(tree: Path):
    with pytest.raises(embed.EmbedError, match="never closed"):
        embed.render("<!-- table: docs/results/m/table.md#m/s1 -->\n| x |\n", tree)
    with pytest.raises(embed.EmbedError, match="does not exist"):
        embed.render("<!-- table: docs/results/x/table.md#m/s1 -->\n<!-- /table -->\n", tree)
    with pytest.raises(embed.EmbedError, match="malformed"):
        embed.render("<!-- table: docs/results/m/table.md -->\n<!-- /table -->\n", tree)


def test_check_mode_exits_1_on_a_stale_block_and_leaves_the_file(tree: Path, capsys):
    doc = tree / "R.md"
    doc.write_text(_doc("| old |\n", ""))
    before = doc.read_text()
    assert embed.main([str(doc), "--root", str(tree), "--check"]) == 1
    assert doc.read_text() == before
    assert "stale line 5" in capsys.readouterr().out
    assert embed.main([str(doc), "--root", str(tree)]) == 0
    assert embed.main([str(doc), "--root", str(tree), "--check"]) == 0


def test_results_md_tables_agree_with_the_committed_table_md():
    """Fails when a matrix's table.md changed and RESULTS.md was not regenerated:
    python benchmarks/embed_tables.py rewrites the blocks."""
    text = (ROOT / "docs/RESULTS.md").read_text()
    blocks = embed.find_blocks(text.split("\n"), "docs/RESULTS.md")
    assert len(blocks) >= 6, "RESULTS.md embeds each matrix's table (one block per matrix at least)"
    assert {b.path for b in blocks} >= {
        f"docs/results/{m}/table.md" for m in ("fedacs-table1", "fedamp-table2", "fedamp-table3",
                                               "pfedbred-table1", "plgu-lowest5",
                                               "selffl-synthetic")}
    assert embed.stale_blocks(text, ROOT, "docs/RESULTS.md") == [], (
        "run: python benchmarks/embed_tables.py")


pairs = _load("cell_pairs")


def _cell(root: Path, strategy: str, seed: int, bmta: float, final: float, wall: float) -> None:
    d = root / "docs/results/m/runs/s" / strategy / f"seed-{seed}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(
        '{"status": "completed", "bmta": %r, "final": {"personal_mean": %r}}' % (bmta, final))
    (d / "bench-cell.json").write_text('{"status": "completed", "wall_s": %r}' % wall)


def test_cell_pairs_pairs_by_seed_in_the_asked_column(tmp_path: Path, monkeypatch, capsys):
    # A has seeds 0-2, B seeds 0-1 and 3: only seeds 0 and 1 pair; BMTA and final differ
    for seed, bmta, final in ((0, 0.90, 0.80), (1, 0.92, 0.85), (2, 0.99, 0.99)):
        _cell(tmp_path, "a", seed, bmta, final, 100.0 + seed)
    for seed, bmta, final in ((0, 0.85, 0.81), (1, 0.86, 0.80), (3, 0.10, 0.10)):
        _cell(tmp_path, "b", seed, bmta, final, 50.0)
    monkeypatch.chdir(tmp_path)
    pairs.main(["docs/results/m", "s", "a", "b", "--metric", "bmta"])
    out = capsys.readouterr().out
    # BMTA per seed +5.00, +6.00 -> mean +5.50, half = t(0.975, 1) * 0.7071 / sqrt(2) = 6.35
    assert "seeds 0,1:" in out and \
        "+5.00, +6.00; mean +5.50 [-0.85, +11.85]; not resolved at 2 seeds (±6.35)\n" in out
    pairs.main(["docs/results/m", "s", "a", "b", "--metric", "final", "--seeds", "1"])
    assert "per seed +5.00; mean +5.00 (1 seed: no interval)" in capsys.readouterr().out
    pairs.main(["docs/results/m", "s", "a", "b", "--metric", "wall_s"])
    assert "+50.00, +51.00" in capsys.readouterr().out


def test_cell_pairs_reads_a_git_revision_not_the_working_tree(tmp_path: Path, monkeypatch,
                                                               capsys):
    import subprocess
    for seed in (0, 1):
        _cell(tmp_path, "a", seed, 0.90 + 0.01 * seed, 0.9, 1.0)
        _cell(tmp_path, "b", seed, 0.80, 0.8, 1.0)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    subprocess.run(git + ["commit", "-qm", "cells"], cwd=tmp_path, check=True)
    # the working tree changes after the commit; --rev HEAD still reads the committed cells
    (tmp_path / "docs/results/m/runs/s/a/seed-0/summary.json").write_text(
        '{"status": "completed", "bmta": 0.5, "final": {"personal_mean": 0.5}}')
    monkeypatch.chdir(tmp_path)
    pairs.main(["docs/results/m", "s", "a", "b", "--rev", "HEAD"])
    assert "per seed +10.00, +11.00" in capsys.readouterr().out
    pairs.main(["docs/results/m", "s", "a", "b"])
    assert "per seed -30.00, +11.00" in capsys.readouterr().out
