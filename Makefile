# Two entry points for a fresh machine: `make demo` and `make test`. Both install what they need first.
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
DATA_DIR ?= annotate-data
PROMPT ?= dog. cat.

.PHONY: install demo test test-fast lint bench clean rehearse sam-build chaos

$(INSTALLED): pyproject.toml package.json scripts/install.sh scripts/native_wheels.sh
	LLAMA_CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" scripts/install.sh
	touch $@

install: $(INSTALLED)

demo: install
	$(BIN)/annotate run samples/ --prompt "$(PROMPT)" --profile tiny --data-dir $(DATA_DIR)
	$(BIN)/annotate query --data-dir $(DATA_DIR) \
	  "SELECT source_uri, status, len(detections) AS boxes, caption FROM images_latest ORDER BY source_uri"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy shared tools

# One test worker per core, each test file on one worker: many tests keep one core busy (moto's interpreter, one
# process's Python), so two workers finish in about two thirds of the time on 2 cores.
test: install lint
	$(BIN)/python -m pytest -n auto --dist loadfile

# Unit and functional tests (the workflow with fake models and storage): under a minute, no model loads.
test-fast: install
	$(BIN)/python -m pytest tests/unit tests/functional

# template.yaml deployed on moto in eu-central-1 (with and without variants) and the user's story played through
# it, every AWS call checked against its role. tests/rehearsal runs the same in `make test`.
rehearse: install
	$(BIN)/python -m tools.rehearsal

# 200 generated images through the local workflow with AWS faults injected (throttles, SnapStart and service errors,
# S3 SlowDown and 500s, a step that hangs once, a Spot task reclaimed, no Spot capacity for a while), on a new
# account's Lambda concurrency of 10 (nothing reserved: Ingest competes with the batches for it, its messages arriving
# while they run) and 6 Fargate vCPUs; then the exactly-once checker's long profile, whose last line (exactly once:
# R runs, S steps, B broken) ends the output. tests/ run shorter ones.
chaos: install
	$(BIN)/annotate chaos --images 200 --lambda-concurrency 10 --batches 2 --message-interval 5 --snapstart-reinit 20 \
		--bulk-images 12 --fargate-vcpus 6 --spot-shortage 20 --function-memory 3008
	$(BIN)/annotate exactly-once --runs 400 --steps 30

# `sam validate --lint` and `sam build` of every zip function and layer, without Docker (not part of make test).
sam-build: install
	scripts/sam_build.sh

clean:
	rm -rf $(VENV) .venv-sam .venv-labelstudio .aws-sam node_modules $(DATA_DIR)

# llama.cpp for Lambda: every Lambda CPU (AVX2), and ggml's own thread pool instead of OpenMP, whose libgomp.so.1
# Lambda's runtime does not have (tools/aws/native_libs.py checks every layer's libraries against the runtime). The
# virtual environment has the same build (scripts/install.sh), so local captions and annotate bench are Lambda's.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF

# `sam build` (BuildMethod: makefile) calls these with ARTIFACTS_DIR set. pip fetches the wheels for Lambda's
# Python 3.12 on manylinux x86_64, whatever this machine is; llama-cpp-python has no such wheel, so it is compiled
# here with Python 3.12, portably (GGML_NATIVE=OFF: AVX2, every Lambda CPU).
# (Lambda's python3.12 is Amazon Linux 2023, glibc 2.34: manylinux_2_28 wheels and older run on it.)
# sam build needs Python 3.12, Lambda's runtime, on PATH: it builds the functions with it, and the llama.cpp layer
# compiles against it. Every layer is then checked against Lambda's runtime (tools/aws/native_libs.py, from the project's
# environment: make install), so a layer whose libraries would not load there fails its build, not its first call.
NEED_PYTHON312 := command -v python3.12 >/dev/null || { echo "sam build needs python3.12 (Lambda's runtime) on PATH" >&2; exit 1; }
NATIVE_CHECK := $(CURDIR)/$(BIN)/python -m tools.aws.native_libs
LAYER_PIP := python3 -m pip install --quiet --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  --implementation cp --python-version 3.12 --only-binary=:all:

build-SharedLayer:
	$(LAYER_PIP) --target "$(ARTIFACTS_DIR)/python" -r layers/shared/requirements.txt
	layers/shared/prune.sh "$(ARTIFACTS_DIR)/python"
	cp -r shared "$(ARTIFACTS_DIR)/python/shared"
	$(NATIVE_CHECK) "$(ARTIFACTS_DIR)/python"

build-ArrowLayer:
	$(LAYER_PIP) --target "$(ARTIFACTS_DIR)/python" -r layers/arrow/requirements.txt
	layers/arrow/prune.sh "$(ARTIFACTS_DIR)/python"
	$(NATIVE_CHECK) "$(ARTIFACTS_DIR)/python"

build-ApiLayer:
	$(LAYER_PIP) --no-deps --target "$(ARTIFACTS_DIR)/python" -r layers/api/requirements.txt
	$(NATIVE_CHECK) "$(ARTIFACTS_DIR)/python"

build-OnnxLayer:
	$(LAYER_PIP) --no-deps --target "$(ARTIFACTS_DIR)/python" -r layers/onnx/requirements.txt
	$(NATIVE_CHECK) "$(ARTIFACTS_DIR)/python"

build-OpenVinoLayer:
	$(LAYER_PIP) --no-deps --target "$(ARTIFACTS_DIR)/python" -r layers/openvino/requirements.txt
	layers/openvino/prune.sh "$(ARTIFACTS_DIR)/python"
	$(NATIVE_CHECK) "$(ARTIFACTS_DIR)/python"

build-LlamaCppLayer:
	@$(NEED_PYTHON312)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" python3.12 -m pip install --quiet --no-deps --target "$(ARTIFACTS_DIR)/python" \
	  -r layers/llama-cpp/requirements.txt
	layers/llama-cpp/prune.sh "$(ARTIFACTS_DIR)/python"
	$(NATIVE_CHECK) "$(ARTIFACTS_DIR)/python"
