"""The rewrites of a finished ONNX form: named rules in one ordered list per form.

Each rule rewrites a model in place and returns how many places it rewrote (0:
it did not fire). `apply_rules` runs a list in order and records what fired.
A rule that fails (a graph no rule foresaw, a hostile file's) never turns into
a silent fallback: `RuleFailed` carries the rule's name and the error, and the
engine that asked refuses the method or delegate with that reason, which
`execution` and `--dump-engine` show.

The order is the algebra: a rule runs where the ones before it have left the
graph in the form it matches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exirc.runtime.engines.onnx_form.builder import NotMapped
from exirc.runtime.engines.onnx_form.rewrites.gelu import fuse_tanh_gelus
from exirc.runtime.engines.onnx_form.rewrites.gru import fuse_grus
from exirc.runtime.engines.onnx_form.rewrites.hardsigmoid import fuse_hardsigmoids
from exirc.runtime.engines.onnx_form.rewrites.lstm import fuse_lstms
from exirc.runtime.engines.onnx_form.rewrites.recurrent_input import (
    fold_recurrent_input_projections,
)
from exirc.runtime.engines.onnx_form.rewrites.reshapes import simplify_reshapes
from exirc.runtime.engines.onnx_form.rewrites.softmax_guard import simplify_bool_reductions

if TYPE_CHECKING:
    from onnx import ModelProto


@dataclass(frozen=True)
class Rule:
    """A named rewrite: `rewrite(model)` -> how many places it rewrote."""

    name: str
    rewrite: Callable[[ModelProto], int]
    what: str


@dataclass
class RuleLog:
    """What each rule of a list did to one model: name -> places rewritten."""

    fired: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return [f"{name}: {count}" for name, count in self.fired.items()]


class RuleFailed(NotMapped):
    """A rule raised: the form is refused with this reason (never silently kept)."""


DELEGATE_RULES = (
    Rule("tanh_gelu", fuse_tanh_gelus, "a decomposed tanh-GELU as one Gelu node"),
    Rule("hard_sigmoid", fuse_hardsigmoids, "Add, Clip, Div as one HardSigmoid"),
    # Before the Reshape rules: the Reshapes LSTM and GRU nodes add are then merged.
    Rule("lstm", fuse_lstms, "an unrolled LSTM layer as one LSTM node"),
    Rule("gru", fuse_grus, "an unrolled GRU layer as one GRU node"),
    Rule("reshapes", simplify_reshapes, "Reshapes the model does not need dropped or merged"),
    # After: Reshapes no longer stand between a projection and its recurrent node.
    Rule("recurrent_input", fold_recurrent_input_projections,
         "an LSTM or GRU input projection folded into the node's W"),
)
"""The rules of one XNNPACK delegate's ONNX form, in order."""

CHAIN_RULES = (
    Rule("bool_reductions", simplify_bool_reductions,
         "the safe-softmax guard's boolean reductions in 3 nodes, not 6"),
    # A backward LSTM direction's projection, reversed by a flip kernel, folds only here.
    Rule("recurrent_input", fold_recurrent_input_projections,
         "an LSTM or GRU input projection folded into the node's W"),
)
"""The rules of a method's fused chain, in order (its delegates' ran already)."""


def apply_rules(model: ModelProto, rules: tuple[Rule, ...]) -> RuleLog:
    """Run `rules` on `model` in order; what fired. A failing rule: `RuleFailed`."""
    log = RuleLog()
    for rule in rules:
        try:
            count = rule.rewrite(model)
        except NotMapped:
            raise
        except Exception as error:  # noqa: BLE001 (recorded as the refusal's reason)
            raise RuleFailed(f"rewrite rule {rule.name!r} failed: {type(error).__name__}: "
                             f"{error}") from error
        log.fired[rule.name] = count
    return log
