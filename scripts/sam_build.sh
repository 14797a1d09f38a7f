#!/usr/bin/env bash
# `make sam-build`: what `sam build` makes of the template on this machine, without Docker.
# The SAM CLI (from PyPI, in its own venv: its pins are not the project's) validates and lints the template, then
# builds every zip function and layer for Lambda's Python 3.12. Image functions (Detect, Classify, Tag) need a
# Docker engine to build: they are skipped, and said so. Each build's seconds are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

python312=$(command -v python3.12 2>/dev/null && python3.12 -V >/dev/null 2>&1 && echo python3.12 \
  || ls /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1 || true)
python312=$(echo "$python312" | tail -1)
[ -n "$python312" ] || { echo "sam build needs Python 3.12 (Lambda's runtime) on this machine" >&2; exit 1; }
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
