"""The built-in passes, registered by their own names, and pipelines read with them.

A pass class carries its pipeline name (`name`), its options (its dataclass
fields) and its documentation (its docstring: the dialect it takes and
returns); this table only lists the classes, so a name is written once. The
targets' default pipelines are data in `exirc/targets/<target>.yaml`.

This module sits above the stages (it imports every built-in pass); the
pipeline format itself is `exirc.passes.pipeline`.
"""

from __future__ import annotations

from pathlib import Path

from exirc.backend.bind_kv_attention import BindKvAttention
from exirc.backend.delegate import Delegate
from exirc.backend.fuse import Fuse
from exirc.backend.keep_attention import KeepAttention
from exirc.backend.keep_lstm import KeepLstm
from exirc.backend.linear_weights import LinearWeights
from exirc.backend.quant_fusion import QuantFusion
from exirc.backend.sym_prims import SymPrims
from exirc.edge.common_subexpressions import CommonSubexpressions
from exirc.edge.constant_fold import ConstantFold
from exirc.edge.dead_code_elimination import DeadCodeElimination
from exirc.edge.fold_batch_norm import FoldBatchNorm
from exirc.edge.lookup_tables import LookupTables
from exirc.edge.merge_permutes import MergePermutes
from exirc.edge.remove_assertions import RemoveAssertions
from exirc.edge.remove_noop_copies import RemoveNoopCopies
from exirc.edge.scalars_to_tensors import ScalarsToTensors
from exirc.edge.to_edge import ToEdge
from exirc.edge.views_to_copies import ViewsToCopies
from exirc.passes import pipeline as pipeline_format
from exirc.passes.contract import Pass
from exirc.passes.pipeline import Pipeline
from exirc.plan.alias_views import AliasViews
from exirc.plan.memory_plan import MemoryPlanPass
from exirc.plan.to_out_variants import ToOutVariants
from exirc.plan.update_caches_in_place import UpdateCachesInPlace
from exirc.plan.write_back_state import WriteBackState
from exirc.targets import DEFAULT_TARGET

# In the order the default pipelines run them.
_BUILTIN_CLASSES: tuple[type[Pass], ...] = (
    KeepLstm, KeepAttention, BindKvAttention, ToEdge, RemoveAssertions, ViewsToCopies,
    MergePermutes, ScalarsToTensors, RemoveNoopCopies, CommonSubexpressions, LookupTables,
    ConstantFold, FoldBatchNorm, DeadCodeElimination,
    SymPrims, Delegate, LinearWeights, Fuse, QuantFusion,
    WriteBackState, UpdateCachesInPlace, AliasViews, ToOutVariants, MemoryPlanPass,
)

BUILTIN_PASSES: dict[str, type[Pass]] = {cls.name: cls for cls in _BUILTIN_CLASSES}


def load_pipeline(target: str = DEFAULT_TARGET, path: str | Path | None = None) -> Pipeline:
    """The default pipeline of `target`, or the one in the YAML file `path`."""
    return pipeline_format.load_pipeline(target, path, BUILTIN_PASSES)


def parse_pipeline(text: str, source: str) -> Pipeline:
    """A pipeline from YAML text naming built-in passes or `module:attr` ones."""
    return pipeline_format.parse_pipeline(text, source, BUILTIN_PASSES)
