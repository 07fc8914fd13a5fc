"""onnxruntime as an engine: XNNPACK delegates and fused chains as sessions."""
