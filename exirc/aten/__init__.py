"""The ATen dialect: what torch.export produces, and its verifier."""

from exirc.aten.verify import verify_aten

__all__ = ["verify_aten"]
