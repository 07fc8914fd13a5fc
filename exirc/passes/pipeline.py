"""The pass pipeline as data: a YAML file of stages, each a list of passes.

    target: portable
    stages:
      edge:
        - to_edge
        - constant_fold: {max_bytes: 16777216}
      plan:
        - to_out_variants

A pass is named by a built-in short name or as `module:attr`, where attr is
a `Pass` subclass (constructed with the entry's options) or a function
`fn(program, **options) -> PassResult`. Stage order is fixed (STAGES); the
passes inside a stage run in the order written.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from exirc.errors import UsageError
from exirc.passes.contract import FunctionPass, Pass
from exirc.targets import DEFAULT_TARGET, pipeline_text

STAGES = ("aten", "edge", "backend", "plan")

# The passes a pipeline file names by a short name: name -> Pass class. The
# built-in ones (`exirc.pipelines.BUILTIN_PASSES`) are the default.
Registry = Mapping[str, type[Pass]]


@dataclass
class Pipeline:
    target: str
    stages: dict[str, list[Pass]] = field(default_factory=dict)
    source: str = "<built-in>"
    registry: Registry = field(default_factory=dict, repr=False)  # short names it knew

    def describe(self) -> str:
        """The resolved pipeline, as YAML a user can save and edit."""
        stages: dict[str, list[Any]] = {}
        for stage in STAGES:
            entries: list[Any] = []
            for p in self.stages.get(stage, []):
                options = _options_of(p)
                name = _reference(p, self.registry)
                entries.append({name: options} if options else name)
            stages[stage] = entries
        text = yaml.safe_dump({"target": self.target, "stages": stages}, sort_keys=False)
        return f"# pipeline from {self.source}\n{text}"


def _reference(p: Pass, registry: Registry) -> str:
    """How a pipeline file names `p`: its short name or `module:attr`."""
    obj: Any = p.function if isinstance(p, FunctionPass) else type(p)
    if registry.get(p.name) is obj:
        return p.name
    return f"{obj.__module__}:{obj.__qualname__}"


def _options_of(p: Pass) -> dict[str, Any]:
    if isinstance(p, FunctionPass):
        return dict(p.options)
    options = {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}


def load_pipeline(target: str, path: str | Path | None, registry: Registry) -> Pipeline:
    """The default pipeline of `target`, or the one in the YAML file `path`."""
    if path is None:
        return parse_pipeline(pipeline_text(target), f"<target {target}>", registry)
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise UsageError(f"cannot read pipeline file {path}: {error.strerror}") from None
    return parse_pipeline(text, str(path), registry)


def parse_pipeline(text: str, source: str, registry: Registry) -> Pipeline:
    """A pipeline from its YAML text; `source` names the text in messages."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise UsageError(f"{source}: not valid YAML: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("stages"), dict):
        raise UsageError(f"{source}: a pipeline is a mapping with `target` and `stages`",
                         hint="see `exirc compile --print-pipeline` for an example")
    unknown = set(data["stages"]) - set(STAGES)
    if unknown:
        raise UsageError(f"{source}: unknown stage(s) {sorted(unknown)}",
                         hint=f"stages are {', '.join(STAGES)}")
    pipeline = Pipeline(target=str(data.get("target", DEFAULT_TARGET)), source=source,
                        registry=registry)
    for stage in STAGES:
        entries = data["stages"].get(stage) or []
        if not isinstance(entries, list):
            raise UsageError(f"{source}: stage {stage} must be a list of passes")
        pipeline.stages[stage] = [_make_pass(entry, f"{source}: {stage}[{i}]", registry)
                                  for i, entry in enumerate(entries)]
    return pipeline


def _make_pass(entry: Any, where: str, registry: Registry) -> Pass:
    options: dict[str, Any]
    if isinstance(entry, str):
        name, options = entry, {}
    elif isinstance(entry, dict) and len(entry) == 1:
        ((name, options),) = entry.items()
        options = options or {}
        if not isinstance(options, dict):
            raise UsageError(f"{where}: options of {name} must be a mapping")
    else:
        raise UsageError(f"{where}: a pass is a name or a one-key mapping {{name: options}}")
    factory = _resolve(str(name), where, registry)
    if inspect.isclass(factory) and issubclass(factory, Pass):
        valid = {f.name for f in dataclasses.fields(factory)}
        bad = set(options) - valid
        if bad:
            raise UsageError(f"{where}: {name} has no option(s) {sorted(bad)}",
                             hint=f"its options: {', '.join(sorted(valid)) or 'none'}")
        options = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
        return factory(**options)
    if callable(factory):
        return FunctionPass(factory, tuple(sorted(options.items())))
    raise UsageError(f"{where}: {name} is neither a Pass class nor a function")


def _resolve(name: str, where: str, registry: Registry) -> Any:
    if name in registry:
        return registry[name]
    if ":" not in name:
        raise UsageError(f"{where}: unknown pass {name!r}",
                         hint=f"built-in passes: {', '.join(sorted(registry))}; "
                              "or name your own as module:attr (`exirc passes` lists them)")
    return import_reference(name, where)


def import_reference(name: str, where: str) -> Any:
    """The object a `module:attr` reference names (a plugged pass or partitioner);
    a UsageError, prefixed by `where`, when it cannot be imported."""
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"{where}: cannot import {module_name}: {error}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UsageError(f"{where}: {module_name} has no {attr}") from None
