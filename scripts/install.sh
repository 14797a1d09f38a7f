#!/usr/bin/env bash
# Set up everything `make demo` and `make test` need on a fresh machine with Python 3.11: the virtual
# environment, the pinned Python packages, the compiled llama.cpp and stable-diffusion.cpp bindings
# (built once per machine into a wheel cache, see native_wheels.sh) and the offline validators from npm.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3.11}
venv=.venv
# llama.cpp built as the Caption layer and the bulk image are (the Makefile's LLAMA_CMAKE_ARGS), not for this CPU:
# greedy captions differ between the two builds, and a native one captioned about 18% faster here (AVX-512, OpenMP),
# so local runs would not caption as the stack does and annotate bench would time what is not deployed.
llama_cmake_args=${LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_OPENMP=OFF}

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade "pip==26.3" wheel
llama_wheels=$(CMAKE_ARGS="$llama_cmake_args" scripts/native_wheels.sh "$venv/bin/python" llama-cpp-python==0.3.36)
sd_wheels=$(scripts/native_wheels.sh "$venv/bin/python" stable-diffusion-cpp-python==0.4.7)
# torch 2.14.1 + torchvision 0.29.1 first and alone: pip resolves them from this machine's disk, and a
# resolver that sees them later may prefer a newer CUDA build.
"$venv/bin/python" -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
"$venv/bin/python" -m pip install --quiet --find-links "$llama_wheels" --find-links "$sd_wheels" -e ".[dev]"
# An environment made before may hold another build of the same version, which pip would keep.
"$venv/bin/python" -m pip install --quiet --no-deps --force-reinstall "$llama_wheels"/*.whl
# A real Label Studio for the ML backend's test, in an environment of its own: its pins (Django, numpy) are not ours.
ls_venv=.venv-labelstudio
if [ ! -x "$ls_venv/bin/label-studio" ]; then
  "$python" -m venv "$ls_venv"
  "$ls_venv/bin/python" -m pip install --quiet "label-studio==1.23.2"
fi
command -v npm >/dev/null || { echo "npm is needed for asl-validator (the ASL check of make test)" >&2; exit 1; }
npm install --silent --no-audit --no-fund
# Headless Chromium for the gallery's browser test (Debian's package; Playwright drives it, never downloads one).
if ! command -v chromium >/dev/null; then
  as_root=(); [ "$(id -u)" = 0 ] || as_root=(sudo)
  "${as_root[@]}" apt-get install -y -q chromium >/dev/null \
    || { "${as_root[@]}" apt-get update -q >/dev/null && "${as_root[@]}" apt-get install -y -q chromium >/dev/null; } \
    || { echo "Chromium (Debian's chromium package) is needed for the gallery test of make test" >&2; exit 1; }
fi
