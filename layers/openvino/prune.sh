#!/usr/bin/env bash
# Keep of an installed openvino what runs an IR on the CPU (about 90 MB of 180 MB go): the GPU and NPU plugins,
# the readers of other formats and their Python (Detect reads the export's IR), the converter, headers and CMake.
# Checked by tests/integration/test_packaging.py, which runs an IR with an openvino pruned by this script.
set -euo pipefail
site=${1:?usage: prune.sh SITE_PACKAGES_DIR}
cd "$site/openvino"
rm -rf tools include cmake
rm -f libs/cache.json libs/libopenvino_c.so.* libs/libopenvino_intel_gpu_plugin.so libs/libopenvino_intel_npu_plugin.so
rm -f libs/libopenvino_auto_plugin.so libs/libopenvino_auto_batch_plugin.so libs/libopenvino_hetero_plugin.so
for frontend in gguf jax onnx paddle pytorch tensorflow tensorflow_lite; do
    rm -f "libs/libopenvino_${frontend}_frontend.so."*
    rm -rf "frontend/${frontend}"
done
