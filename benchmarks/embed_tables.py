"""Rewrite the tables embedded in docs/RESULTS.md from the matrices' table.md files.

An embedded table sits between two markers:

    <!-- table: docs/results/fedacs-table1/table.md#fedacs-table1/dir05-50samples -->
    | ... the generated table ... |
    <!-- /table -->

The part after ``#`` names a heading of table.md by its text, inner heading last, ancestors
before it separated by "/" (they must be the headings directly above it: "Paired
comparisons/dir05-50samples" is the "### dir05-50samples" under "## Paired comparisons").
The block gets the first markdown table under that heading, copied line for line. An
optional ``| match=REGEX`` after the selector keeps the header and only the rows the
regular expression finds (``re.search`` on the row's text):

    <!-- table: docs/results/plgu-lowest5/table.md#Paired comparisons/dir03 | match=final mean -->

    python benchmarks/embed_tables.py            # rewrite docs/RESULTS.md in place
    python benchmarks/embed_tables.py --check    # exit 1 and name each stale block

Idempotent: a second run changes nothing. Paths are relative to the repository root.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

OPEN = re.compile(r"^<!-- table: (?P<path>[^#\s]+)#(?P<sel>[^|]+?)"
                  r"(?:\s*\|\s*match=(?P<match>.*?))?\s*-->\s*$")
CLOSE = "<!-- /table -->"
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")


class EmbedError(ValueError):
    """A marker that cannot be resolved (the message names the file, line and fix)."""


@dataclass(frozen=True)
class Block:
    start: int            # index of the opening marker line
    end: int              # index of the closing marker line
    path: str
    selector: str
    match: str | None


def find_blocks(lines: list[str], doc: str = "document") -> list[Block]:
    """The marker blocks of a document, in order."""
    blocks, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("<!-- table:"):
            m = OPEN.match(line)
            if m is None:
                raise EmbedError(f"{doc}:{i + 1}: malformed marker {line!r}; write "
                                 "'<!-- table: PATH#HEADING[/SUBHEADING] [| match=REGEX] -->'")
            for j in range(i + 1, len(lines)):
                if lines[j].startswith("<!-- table:"):
                    raise EmbedError(f"{doc}:{i + 1}: marker not closed before the next one "
                                     f"at line {j + 1}; add '{CLOSE}'")
                if lines[j].strip() == CLOSE:
                    blocks.append(Block(i, j, m["path"], m["sel"].strip(), m["match"]))
                    i = j
                    break
            else:
                raise EmbedError(f"{doc}:{i + 1}: marker never closed; add '{CLOSE}'")
        i += 1
    return blocks


def select_table(text: str, selector: str, source: str = "table.md",
                 match: str | None = None) -> list[str]:
    """The first markdown table under the heading ``selector`` names (see the module doc)."""
    want = [part.strip() for part in selector.split("/") if part.strip()]
    if not want:
        raise EmbedError(f"{source}: empty heading selector")
    lines = text.splitlines()
    stack: list[tuple[int, str]] = []          # (level, text) of the headings above
    hits: list[int] = []
    for idx, line in enumerate(lines):
        h = HEADING.match(line)
        if h is None:
            continue
        level = len(h.group(1))
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, h.group(2)))
        names = [name for _, name in stack]
        if names[-len(want):] == want and len(names) >= len(want):
            hits.append(idx)
    if not hits:
        raise EmbedError(f"{source}: no heading {selector!r} (headings are matched by their "
                         "full text; name ancestors with '/')")
    if len(hits) > 1:
        raise EmbedError(f"{source}: heading {selector!r} is ambiguous (lines "
                         + ", ".join(str(h + 1) for h in hits)
                         + "); name its parent heading too, e.g. 'PARENT/" + want[-1] + "'")
    table: list[str] = []
    for line in lines[hits[0] + 1:]:
        if HEADING.match(line):
            break
        if line.startswith("|"):
            table.append(line.rstrip())
        elif table:
            break
    if not table:
        raise EmbedError(f"{source}: no table under heading {selector!r}")
    if match is not None:
        pattern = re.compile(match)
        kept = table[:2] + [row for row in table[2:] if pattern.search(row)]
        if len(kept) == 2:
            raise EmbedError(f"{source}: no row of the table under {selector!r} matches "
                             f"{match!r}")
        table = kept
    return table


def render(text: str, root: Path, doc: str = "document") -> str:
    """The document with every block's content regenerated from its table.md."""
    lines = text.split("\n")
    out: list[str] = []
    prev = 0
    for block in find_blocks(lines, doc):
        source = root / block.path
        if not source.is_file():
            raise EmbedError(f"{doc}:{block.start + 1}: {block.path} does not exist "
                             "(regenerate it: flower-pfl bench MATRIX --out DIR --table-only)")
        table = select_table(source.read_text(), block.selector, block.path, block.match)
        out.extend(lines[prev:block.start + 1])
        out.extend(table)
        out.append(lines[block.end])
        prev = block.end + 1
    out.extend(lines[prev:])
    return "\n".join(out)


def stale_blocks(text: str, root: Path, doc: str = "document") -> list[str]:
    """'line N: PATH#SELECTOR' for each block whose content differs from its table.md."""
    lines = text.split("\n")
    stale = []
    for block in find_blocks(lines, doc):
        source = root / block.path
        if not source.is_file():
            stale.append(f"line {block.start + 1}: {block.path} missing")
            continue
        want = select_table(source.read_text(), block.selector, block.path, block.match)
        if [line.rstrip() for line in lines[block.start + 1:block.end]] != want:
            stale.append(f"line {block.start + 1}: {block.path}#{block.selector}")
    return stale


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("docs", nargs="*", default=["docs/RESULTS.md"],
                   help="documents to rewrite (default docs/RESULTS.md)")
    p.add_argument("--root", default=".", help="repository root the marker paths are under")
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 when a block differs from its table.md")
    args = p.parse_args(argv)
    root = Path(args.root)
    status = 0
    for name in args.docs:
        path = Path(name)
        text = path.read_text()
        try:
            if args.check:
                stale = stale_blocks(text, root, name)
                for item in stale:
                    print(f"{name}: stale {item}")
                if stale:
                    print(f"{name}: run 'python benchmarks/embed_tables.py {name}' to rewrite")
                    status = 1
                continue
            new = render(text, root, name)
        except EmbedError as exc:
            print(f"embed_tables: {exc}", file=sys.stderr)
            return 2
        if new != text:
            path.write_text(new)
            print(f"{name}: {len(find_blocks(new.split(chr(10)), name))} table(s) rewritten")
        else:
            print(f"{name}: up to date")
    return status


if __name__ == "__main__":
    sys.exit(main())
