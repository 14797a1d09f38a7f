"""Model files made here: the ONNX exports, the reference models on torch, random-weight models built offline, and the
upload to a stack."""
