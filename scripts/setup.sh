#!/usr/bin/env bash
# Set up flower-pfl on a fresh Debian machine: the Fashion-MNIST Debian package and a
# virtual environment (.venv) with the project and its test and tensorboard extras.
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! dpkg -s dataset-fashion-mnist >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch/torchvision pinned to the releases this project is tested with (pyproject.toml).
# --no-compile, then compileall on every core: pip compiles each installed file to bytecode one
# after another (~17,500 files, ~270 MB of Python: ~80 s of one core, most of a fresh
# install); compileall writes the same .pyc files (timestamp-checked, as pip's) with one worker
# a core. Like pip, it goes on past a file that does not compile (some packages ship such
# files as test data); up-to-date .pyc files are left as they are.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-compile \
  -e ".[test,tensorboard]" 2>&1 | { grep -v "^WARNING: Location" || true; }
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
.venv/bin/python -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
echo "setup: OK ($(.venv/bin/python -c 'import flwr, torch; print("flwr", flwr.__version__, "torch", torch.__version__)'))"
