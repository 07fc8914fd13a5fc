"""The file format: the program model and `.pte` bytes, both ways.

`serialize` writes a program model as `.pte` bytes; `deserialize` reads with
every offset, length and index checked, raising `exirc.errors.FormatError` on
anything malformed. The program model (`exirc.serialize.program`) and the
metadata segments exirc adds (symbolic shapes, constant names, bundled cases)
live here too: the runtime, the emitter and the inspector all share them, as
does the external data file (`.ptd`) a program's weights may be kept in
(`exirc.serialize.data_file`).
"""

from exirc.serialize.reader import ProgramFile, deserialize, read_program_file
from exirc.serialize.writer import serialize

__all__ = ["ProgramFile", "deserialize", "read_program_file", "serialize"]
