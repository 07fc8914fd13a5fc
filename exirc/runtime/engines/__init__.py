"""Optional engines: faster ways to run what the reference interpreter runs.

The only place `onnx`, `onnxruntime` and `ai_edge_litert` are imported. The
interpreter reaches the engines through one seam (`seam`); each engine lives
in its own folder:

    onnx_form     a method's chain and XNNPACK payloads as ONNX models (the
                  translators and the ordered rewrites both engines build on)
    onnxruntime   runs ONNX forms on onnxruntime
    litert        runs them, rewritten as TFLite models, on LiteRT's XNNPACK
"""
