#!/usr/bin/env bash
# Drop what writing Parquet never loads from an installed pyarrow (about 60 MB): Flight, the S3 filesystem,
# tests, headers and Cython sources. Checked by tests/integration/test_packaging.py, which writes and reads a
# Parquet file with a pyarrow pruned by this script.
set -euo pipefail
site=${1:?usage: prune.sh SITE_PACKAGES_DIR}
cd "$site/pyarrow"
rm -rf tests include src
rm -f libarrow_flight.so* libarrow_python_flight.so* _flight.*.so libarrow_s3.so* _s3fs.*.so ./*.pyx ./*.pxd ./*.pxi
