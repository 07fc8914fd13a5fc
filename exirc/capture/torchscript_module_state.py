"""A scripted module's parameters, buffers and submodules, mirrored for torch.export.

The TorchScript interpreter runs the graph against this mirror rather than
the scripted module, so that export lifts the parameters and buffers under
the names they have in the scripted module.
"""

from __future__ import annotations

from typing import Any

import torch


class ModuleState(torch.nn.Module):
    """One scripted module's parameters, buffers and submodules, as export lifts them.

    Other attributes (ints, lists, tensors that are neither) are read from
    the scripted module, which is kept out of the module tree on purpose.
    """

    def __init__(self, script: torch.jit.ScriptModule) -> None:
        super().__init__()
        self._script: dict[str, Any] = {"module": script}  # a dict: not a registered submodule
        for name, tensor in script.named_parameters(recurse=False):
            # (a loaded archive's parameters are plain tensors; this shares their storage)
            self.register_parameter(name, torch.nn.Parameter(tensor, tensor.requires_grad))
        for name, buffer in script.named_buffers(recurse=False):
            self.register_buffer(name, buffer)
        for name, child in script.named_children():
            assert isinstance(child, torch.jit.ScriptModule), child
            self.add_module(name, ModuleState(child))
        self.train(script.training)

    def attribute(self, name: str) -> Any:
        """What `prim::GetAttr[name]` reads from this module."""
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                return table[name]
        if name == "training":
            return self.training
        return getattr(self._script["module"], name)
