"""Stage: serialize. Program model <-> `.pte` bytes.

`exirc.serialize.writer.serialize` writes; `deserialize` reads with every
offset, length and index checked, raising `exirc.errors.FormatError` on
anything malformed.

The package's face is the reading side only: the writer builds the file with
the generated bindings (`exirc.serialize.generated`, inside this package), so
importing it from here would make the package import itself. Reading needs
neither the bindings nor the `flatbuffers` library.
"""

from exirc.serialize.reader import ProgramFile, deserialize, read_program_file

__all__ = ["ProgramFile", "deserialize", "read_program_file"]
