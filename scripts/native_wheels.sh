#!/usr/bin/env bash
# Build llama-cpp-python and stable-diffusion-cpp-python once per machine into a wheel cache, then print
# the cache folder so that `pip install --find-links` reuses it. Both are source-only on PyPI and take
# minutes to compile on 2 cores; CI runs on the same machine, so the cache turns that into seconds.
#
# The cache key is the package version, the CMake flags and, for native builds, the CPU's instruction
# set flags: a wheel built with -march=native must never be reused on a different CPU.
#
#   scripts/native_wheels.sh PYTHON PACKAGE==VERSION [...]
#   CMAKE_ARGS="-DGGML_NATIVE=OFF" scripts/native_wheels.sh ...   # portable build (Lambda layers, images)
set -euo pipefail

python=${1:?usage: native_wheels.sh PYTHON PACKAGE==VERSION...}
shift
cache_root=${ANNOTATE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/annotate/wheels}
cmake_args=${CMAKE_ARGS:-}
# ggml's AMX path (chosen by -march=native on CPUs with AMX, such as Sapphire Rapids) segfaults on the first
# Q4_K_M matrix product (llama.cpp issue 20824, closed without a fix): on such CPUs build for AVX-512 without AMX.
if [[ "$cmake_args" != *GGML_NATIVE=OFF* ]] && grep -m1 -E '^flags' /proc/cpuinfo 2>/dev/null | grep -qw amx_int8; then
  cmake_args="$cmake_args -DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
fi
cpu_flags=$(grep -m1 -E '^flags' /proc/cpuinfo 2>/dev/null | md5sum | cut -c1-12 || echo unknown)
[[ "$cmake_args" == *GGML_NATIVE=OFF* ]] && cpu_flags=portable
key=$(printf '%s|%s|%s' "$(uname -m)" "$cmake_args" "$cpu_flags" | md5sum | cut -c1-12)

for requirement in "$@"; do
  name=${requirement%%==*}
  dir="$cache_root/$name-${requirement##*==}-$key"
  if ! ls "$dir"/*.whl >/dev/null 2>&1; then
    echo "building $requirement into $dir (once per machine; several minutes)" >&2
    mkdir -p "$dir.tmp"
    # Never enable LLGUIDANCE: it needs cargo and the network.
    CMAKE_ARGS="$cmake_args -DLLAMA_LLGUIDANCE=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      "$python" -m pip wheel --no-deps --no-cache-dir -w "$dir.tmp" "$requirement" >&2  # pip's own cache ignores CMAKE_ARGS
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
  fi
  echo "$dir"
done
