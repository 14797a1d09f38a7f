#!/usr/bin/env bash
# Set up everything `make demo` and `make test` need on a fresh machine with Python 3.11: the virtual
# environment, the pinned Python packages, the natively compiled llama.cpp binding (built once per machine
# into a wheel cache, see native_wheels.sh) and the offline validators from npm.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3.11}
venv=.venv
llama_cpp=llama-cpp-python==0.3.36

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade "pip==26.3" wheel
llama_wheels=$(scripts/native_wheels.sh "$venv/bin/python" "$llama_cpp")
# torch 2.14.1 + torchvision 0.29.1 first and alone: pip resolves them from this machine's disk, and a
# resolver that sees them later may prefer a newer CUDA build.
"$venv/bin/python" -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
"$venv/bin/python" -m pip install --quiet --find-links "$llama_wheels" -e ".[dev]"
if command -v npm >/dev/null; then
  npm install --silent --no-audit --no-fund
else
  echo "npm not found: the ASL validation test will be skipped" >&2
fi
