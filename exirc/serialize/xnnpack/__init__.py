"""The XNNPACK delegate payload format (ExecuTorch's `XnnpackBackend` blob).

`graph` is the payload as Python data. The reader and writer turn it into
bytes and back, checking every offset, id and size on the way in.
"""
