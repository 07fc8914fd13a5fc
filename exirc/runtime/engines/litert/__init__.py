"""LiteRT (TFLite's runtime, with XNNPACK) as an engine for fused chains.

`chain.litert_form` decides at load whether a fused chain runs here;
`onnx_to_tflite` writes the chain's ONNX form as a TFLite model
(`tflite_builder`); `engine` runs it. The package `ai-edge-litert` is an
optional dependency (`exirc[litert]`), imported only when a chain is built.
"""
