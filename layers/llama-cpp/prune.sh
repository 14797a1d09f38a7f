#!/usr/bin/env bash
# Drop what the Python binding never loads from an installed llama-cpp-python: the wheel's second copy of the
# libraries with the command-line tools' libllama-common (which needs OpenSSL 3 and GCC 12's libstdc++, neither on
# Lambda's runtime) and the C headers. The binding loads llama_cpp/lib/. Checked by tests/integration/test_packaging.py.
set -euo pipefail
site=${1:?usage: prune.sh SITE_PACKAGES_DIR}
rm -rf "$site/lib" "$site/include" "$site/bin"
