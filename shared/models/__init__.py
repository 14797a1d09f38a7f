"""The models: each behind a small protocol and a cached `load_x(settings)`, their export runtimes (OpenVINO, ONNX
Runtime, llama.cpp, stable-diffusion.cpp) and where model files come from (local folders, S3, the hub)."""
