"""Stage: serialize. Program model <-> `.pte` bytes.

`serialize` writes; `deserialize` reads with every offset, length and index
checked, raising `exirc.errors.FormatError` on anything malformed.
"""

from exirc.serialize.reader import ProgramFile, deserialize, read_program_file
from exirc.serialize.writer import serialize

__all__ = ["ProgramFile", "deserialize", "read_program_file", "serialize"]
