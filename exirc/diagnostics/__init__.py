"""Documentation of exirc's errors: the error-code catalogue behind `exirc explain`.

Pure data and lookups, no torch: `exirc explain` must stay as fast as `--help`.
"""

from exirc.diagnostics.catalogue import CATALOGUE, closest_codes, lookup
from exirc.diagnostics.error_doc import EXIT_CODES, ErrorDoc

__all__ = ["CATALOGUE", "EXIT_CODES", "ErrorDoc", "closest_codes", "lookup"]
