#!/usr/bin/env bash
# `make sam-build`: what `sam build` makes of the template on this machine, without Docker.
# The SAM CLI (from PyPI, in its own venv: its pins are not the project's) validates and lints the template, then
# builds every function and layer for Lambda's Python 3.12: all are zip packages on layers (docs/deploy.md), so no
# Docker engine is needed. Each build's seconds are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

# Lambda's runtime is Python 3.12: sam builds with a python3.12 found on PATH, else pyenv's, else uv's
python312=""
for candidate in "$(command -v python3.12 || true)" \
  "$(command -v pyenv >/dev/null && version=$(pyenv versions --bare | grep -E '^3\.12(\.[0-9]+)?$' | tail -1) \
    && [ -n "$version" ] && echo "$(pyenv root)/versions/$version/bin/python3.12" || true)" \
  "$(command -v uv >/dev/null && uv python find 3.12 2>/dev/null || true)"; do
  if [ -n "$candidate" ] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    python312=$candidate
    break
  fi
done
[ -n "$python312" ] || {
  echo "sam build needs Python 3.12 (Lambda's runtime): install it (pyenv install 3.12, uv python install 3.12," \
    "or the system's python3.12) and run again" >&2
  exit 1
}
[ "${1:-}" != "--which-python" ] || { echo "$python312"; exit 0; }
venv=.venv-sam
[ -x "$venv/bin/sam" ] || { "$python312" -m venv "$venv" && "$venv/bin/pip" install --quiet "aws-sam-cli==1.170.0"; }
# sam looks for python3.12 on PATH to build python3.12 functions; the layer recipes call python3.12 too.
export PATH="$(dirname "$("$python312" -c 'import sys; print(sys.executable)')"):$PWD/$venv/bin:$PATH"
export SAM_CLI_TELEMETRY=0

sam validate --lint --template-file template.yaml
read -r -a zip_resources <<<"$(.venv/bin/python - <<'PY'
from samtranslator.yaml_helper import yaml_parse
resources = yaml_parse(open("template.yaml").read())["Resources"]
print(" ".join(
    name for name, r in resources.items()
    if r["Type"] in ("AWS::Serverless::LayerVersion", "AWS::Serverless::Function")
))
PY
)"
timings=()
for resource in "${zip_resources[@]}"; do
  started=$(date +%s)
  # --build-in-source: the layers' ContentUri is the repository (their Makefile recipes read shared/ and
  # layers/), which sam would otherwise copy whole, .venv included, before building.
  sam build "$resource" --template-file template.yaml --build-dir .aws-sam/build --build-in-source
  timings+=("$resource $(( $(date +%s) - started )) s")
done
printf '%s\n' "${timings[@]}"
du -sh .aws-sam/build/* 2>/dev/null || true
