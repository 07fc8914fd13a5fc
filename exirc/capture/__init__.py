"""The capture stage: load a model file, then torch.export each of its methods.

    loaded = load_model("model.py")                   # or model.py:make, .pt2, TorchScript
    programs = {name: capture(source) for name, source in loaded.methods.items()}
"""

from exirc.capture.export import capture
from exirc.capture.load import load_model
from exirc.capture.loaded_model import LoadedModel, MethodSource

__all__ = ["LoadedModel", "MethodSource", "capture", "load_model"]
