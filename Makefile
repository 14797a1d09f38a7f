# Two entry points for a fresh machine: `make demo` and `make test`. Both install what they need first.
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
DATA_DIR ?= annotate-data
PROMPT ?= dog. cat.

.PHONY: install demo test lint bench clean

$(INSTALLED): pyproject.toml package.json scripts/install.sh scripts/native_wheels.sh
	scripts/install.sh
	touch $@

install: $(INSTALLED)

demo: install
	$(BIN)/annotate run samples/ --prompt "$(PROMPT)" --profile tiny --data-dir $(DATA_DIR)
	$(BIN)/annotate query --data-dir $(DATA_DIR) \
	  "SELECT source_uri, status, len(detections) AS boxes, caption FROM images ORDER BY source_uri"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy shared

test: install lint
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) node_modules $(DATA_DIR)

# `sam build` (BuildMethod: makefile) calls these with ARTIFACTS_DIR set; run it with --use-container so the
# wheels match Lambda's Python 3.12 and glibc.
build-SharedLayer:
	python3 -m pip install --quiet --target "$(ARTIFACTS_DIR)/python" -r layers/shared/requirements.txt
	cp -r shared "$(ARTIFACTS_DIR)/python/shared"

build-ArrowLayer:
	python3 -m pip install --quiet --target "$(ARTIFACTS_DIR)/python" -r layers/arrow/requirements.txt
	layers/arrow/prune.sh "$(ARTIFACTS_DIR)/python"

build-LlamaCppLayer:
	CMAKE_ARGS="-DGGML_NATIVE=OFF" python3 -m pip install --quiet --no-deps --target "$(ARTIFACTS_DIR)/python" \
	  -r layers/llama-cpp/requirements.txt
