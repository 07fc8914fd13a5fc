"""The ONNX form: XNNPACK payloads and chains of ATen kernels written as ONNX
models, with the semantics exirc's reference interpreter gives them."""
