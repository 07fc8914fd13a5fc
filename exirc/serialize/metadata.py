"""exirc's metadata in a file: one compressed segment, `exirc.metadata`.

Input and output names, module paths, constant names, symbolic shapes and
each instruction's stack trace are exirc's alone (ExecuTorch reads none of
them). In memory they stay where the rest of exirc reads them: a named
segment per kind (`io_names.NAMED_DATA_KEY`, ...) and `Chain.stacktrace`.
In the file they are one deflate-compressed JSON object under one key, a member
per kind: one NamedData and one DataSegment row in the FlatBuffer instead of
one per kind, no Frame tables, and one stream that compresses the whole lot,
with a preset dictionary (`DICTIONARY`) of what most such objects say.
`merged` makes the file's form from the memory's (the writer), `stored` and
`restore_stack_traces` read it back (the reader and the kinds' readers).

Files written before hold a segment per kind and stack traces in the chains;
they read as they always did. Reading is reading untrusted input: a segment
too big, malformed, or with stack traces that do not fit the program's
chains is a FormatError naming `named_data['exirc.metadata']`.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections import Counter
from typing import Any

from exirc.errors import FormatError
from exirc.serialize import json_segment
from exirc.serialize import program as P

NAMED_DATA_KEY = "exirc.metadata"  # a key in files: never renamed
FORMAT_VERSION = 1
_MAX_BYTES = 1 << 25
# The kinds' own keys (never renamed): a member of the merged object each,
# named without the prefix, holding what the kind's own segment held.
KINDS = ("exirc.constant_names", "exirc.io_names", "exirc.module_paths",
         "exirc.symbolic_shapes")
_STACK_TRACES = "stack_traces"
# zlib's preset dictionary for the segment: what most segments say (their
# keys, and words of module paths and source lines), most frequent last.
# Part of the format: a stream names its dictionary by checksum, and this one
# must never change (a new one is a new key).
DICTIONARY = (
    b'"symbolic_shapes":{"format_version":1,"methods":{"forward":{"dims":{"0":["s0",'
    b'"symbols":{"s0":[1,null]}}}},'
    b'.weight (permute_copy)"],"2":["'
    b'site-packages/torch/nn/modules/module.py","_call_impl","return forward_call(*args, '
    b'**kwargs)"],["site-packages/torch/nn/modules/container.py",250,"forward",'
    b'"input = module(input)"],["site-packages/torch/nn/modules/linear.py",125,"forward",'
    b'"return F.linear(input, self.weight, self.bias)"],["'
    b'layers.0.attention.encoder.decoder.embedding.features.classifier.conv.fc.norm.'
    b'hidden = torch.cat(x.view(self.relu(self.conv(self.linear(x)'
    b'{"constant_names":{"buffers":{"1":["net.0.bias"],"'
    b'"format_version":1,"io_names":{"format_version":1,"methods":{"forward":'
    b'{"inputs":["input_ids","x"],"outputs":["output_0"]}}},"module_paths":'
    b'{"format_version":1,"methods":{"forward":[[1,2,3,4,5,0,0,1]]},"paths":["","net.0",'
    b'"stack_traces":{"frames":[["tests/models/model.py",101,"forward",'
    b'"return self.net(x)"]],"lists":[[0]],"methods":[[[0,0,0]]]}}'
)
_WHERE = f"named_data[{NAMED_DATA_KEY!r}]"


def compress(document: dict[str, Any]) -> bytes:
    """The segment of a whole `document` (as `merged` stores it; for tools and tests)."""
    return json_segment.dump({k: v for k, v in document.items() if k != "format_version"},
                             document.get("format_version", FORMAT_VERSION),
                             dictionary=DICTIONARY)


def decompress(data: bytes | memoryview) -> bytes:
    """The JSON text of a segment (`compress`); zlib.error or ValueError if
    it is not one."""
    return json_segment.json_text(data, _MAX_BYTES, DICTIONARY)


def stored(program: P.Program, key: str) -> bytes | memoryview | None:
    """The JSON of kind `key` (one of KINDS): its own segment's (as built in
    memory, or in older files), else the merged segment's member; None if
    neither holds it. A malformed merged segment is a FormatError."""
    own = program.named_segment(key)
    if own is not None:
        return own
    document = _document(program)
    member = None if document is None else document.get(_member(key))
    if member is None:
        return None
    return json.dumps(member, separators=(",", ":"), sort_keys=True).encode()


def restore_stack_traces(program: P.Program) -> None:
    """Put the merged segment's stack traces back in the chains (those that
    have none of their own); a malformed segment, or traces that do not fit
    the chains, are a FormatError."""
    document = _document(program)
    if document is None or _STACK_TRACES not in document:
        return
    try:
        plans = _read_traces(document[_STACK_TRACES])
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise FormatError(f"unreadable stack traces: {error}", field=_WHERE) from None
    if len(plans) != len(program.execution_plan):
        raise FormatError(f"stack traces for {len(plans)} methods, the program has "
                          f"{len(program.execution_plan)}", field=_WHERE)
    for p, (plan, chains) in enumerate(zip(program.execution_plan, plans)):
        if len(chains) != len(plan.chains):
            raise FormatError(f"stack traces for {len(chains)} chains of method {p}, which "
                              f"has {len(plan.chains)}", field=_WHERE)
        for c, (chain, traces) in enumerate(zip(plan.chains, chains)):
            if traces and len(traces) != len(chain.instructions):
                raise FormatError(f"{len(traces)} stack traces for the "
                                  f"{len(chain.instructions)} instructions of chain {c} of "
                                  f"method {p}", field=_WHERE)
            if not chain.stacktrace:
                chain.stacktrace = traces


def merged(program: P.Program) -> P.Program:
    """`program` as the file stores it: the kinds' segments and the chains'
    stack traces moved into one `exirc.metadata` segment (after all others).

    `program` itself is left as it is. What cannot move is written where it
    is: a kind's segment that is not JSON (the reader then says so) or that
    something else points at too. A merged segment already there (a program
    read from a file) is the starting point; if it is not JSON, nothing moves.
    """
    references = _references(program)
    members: dict[str, Any] = {}
    moved: list[int] = []  # named_data entries whose content moves
    for i, entry in enumerate(program.named_data):
        if entry.key not in (NAMED_DATA_KEY, *KINDS):
            continue
        content = _json_object(program, entry, references)
        if content is None:
            if entry.key == NAMED_DATA_KEY:
                return program
            continue
        if entry.key == NAMED_DATA_KEY:
            content.pop("format_version", None)
            content.pop(_STACK_TRACES, None)  # the chains' are the ones to write
            members = {**content, **members}  # a kind's own segment is newer
        else:
            members[_member(entry.key)] = content
        moved.append(i)
    traces = _traces(program)
    if traces is not None:
        members[_STACK_TRACES] = traces
    if not members:
        return program
    return _with_merged(program, moved,
                        json_segment.dump(members, FORMAT_VERSION, dictionary=DICTIONARY))


def _member(key: str) -> str:
    return key.removeprefix("exirc.")


# The last segment parsed, by its data's identity, length and checksum: one
# load reads the segment four times (stack traces, module paths, io names,
# symbolic shapes), and inflating and parsing it is the cost, not the
# checksum. Not the data itself: it may be a view of a mapped file, which
# the cache must not keep open. Readers only read the document.
_last_parsed: tuple[tuple[int, int, int], dict[str, Any]] | None = None


def _document(program: P.Program) -> dict[str, Any] | None:
    global _last_parsed
    data = program.named_segment(NAMED_DATA_KEY)
    if data is None:
        return None
    key = (id(data), len(data), zlib.crc32(data))
    if _last_parsed is not None and _last_parsed[0] == key:
        return _last_parsed[1]
    document = json_segment.parse(data, key=NAMED_DATA_KEY, what="exirc's metadata",
                                  version=FORMAT_VERSION, max_bytes=_MAX_BYTES, read=_members,
                                  dictionary=DICTIONARY)
    _last_parsed = (key, document)
    return document


def _members(document: dict[str, Any]) -> dict[str, Any]:
    for name, member in document.items():
        if name != "format_version" and not isinstance(member, (dict, list)):
            raise ValueError(f"member {name!r} is not an object or a list")
    return document


def _json_object(program: P.Program, entry: P.NamedData,
                 references: Counter[int]) -> dict[str, Any] | None:
    """The JSON object in `entry`'s segment, if it may move: it is one, and
    nothing but `entry` points at the segment."""
    index = entry.segment_index
    if not 0 <= index < len(program.segments) or references[index] != 1:
        return None
    try:
        dictionary = DICTIONARY if entry.key == NAMED_DATA_KEY else b""
        document = json.loads(json_segment.json_text(program.segments[index].data, _MAX_BYTES,
                                                     dictionary))
    except (ValueError, RecursionError, zlib.error):
        return None
    return document if isinstance(document, dict) else None


def _references(program: P.Program) -> Counter[int]:
    """Segment index -> how many things point at it."""
    found: Counter[int] = Counter(entry.segment_index for entry in program.named_data)
    if program.constant_segment is not None:
        found[program.constant_segment.segment_index] += 1
    found.update(s.segment_index for s in program.mutable_data_segments)
    found.update(d.processed.index for plan in program.execution_plan for d in plan.delegates
                 if d.processed.location == P.DataLocation.SEGMENT)
    found.update(s.inside[0] for s in program.segments if s.inside is not None)
    return found


def _with_merged(program: P.Program, moved: list[int], data: bytes) -> P.Program:
    """A copy of `program` without the `moved` entries, their segments and the
    chains' stack traces, and with one segment of `data` for them all."""
    gone = sorted({program.named_data[i].segment_index for i in moved})
    new_index = {old: old - sum(g < old for g in gone) for old in range(len(program.segments))}

    def at(old: int) -> int:
        return new_index.get(old, old)  # out of range: as it was (the reader says so)

    segments = [dataclasses.replace(s, inside=None if s.inside is None
                                    else (at(s.inside[0]), s.inside[1]))
                for i, s in enumerate(program.segments) if i not in gone]
    named = [dataclasses.replace(e, segment_index=at(e.segment_index))
             for i, e in enumerate(program.named_data) if i not in moved]
    segments.append(P.DataSegment(data, packed=True))
    named.append(P.NamedData(NAMED_DATA_KEY, len(segments) - 1))
    plans = [_plan_without_traces(plan, at) for plan in program.execution_plan]
    constant = program.constant_segment
    return dataclasses.replace(
        program, execution_plan=plans, segments=segments, named_data=named,
        constant_segment=None if constant is None
        else dataclasses.replace(constant, segment_index=at(constant.segment_index)),
        mutable_data_segments=[dataclasses.replace(s, segment_index=at(s.segment_index))
                               for s in program.mutable_data_segments])


def _plan_without_traces(plan: P.ExecutionPlan, at: Any) -> P.ExecutionPlan:
    delegates = [d if d.processed.location != P.DataLocation.SEGMENT else
                 dataclasses.replace(d, processed=dataclasses.replace(
                     d.processed, index=at(d.processed.index)))
                 for d in plan.delegates]
    chains = [dataclasses.replace(chain, stacktrace=[]) for chain in plan.chains]
    return dataclasses.replace(plan, chains=chains, delegates=delegates)


def _traces(program: P.Program) -> dict[str, Any] | None:
    """The chains' stack traces as JSON: each distinct frame once, each
    distinct list of them once, and per method, per chain, one list index
    per instruction (an empty chain list: no traces); None if there are none."""
    frames: dict[tuple[Any, ...], int] = {}
    lists: dict[tuple[int, ...], int] = {}
    plans = []
    for plan in program.execution_plan:
        chains = []
        for chain in plan.chains:
            indices = []
            for trace in chain.stacktrace:
                items = tuple(frames.setdefault((f.filename, f.lineno, f.name, f.context),
                                                len(frames)) for f in trace.items)
                indices.append(lists.setdefault(items, len(lists)))
            chains.append(indices)
        plans.append(chains)
    if not frames and not lists:
        return None
    return {"frames": [list(frame) for frame in frames], "lists": [list(x) for x in lists],
            "methods": plans}


def _read_traces(member: Any) -> list[list[list[P.FrameList]]]:
    frames = [_frame(entry) for entry in member["frames"]]
    lists = [P.FrameList([frames[_index(i, len(frames))] for i in listed])
             for listed in member["lists"]]
    return [[[lists[_index(i, len(lists))] for i in chain] for chain in chains]
            for chains in member["methods"]]


def _frame(entry: Any) -> P.Frame:
    filename, lineno, name, context = entry
    if type(lineno) is not int or not all(v is None or isinstance(v, str)
                                          for v in (filename, name, context)):
        raise ValueError(f"frame {entry!r} is not [file, line, name, context]")
    return P.Frame(filename, lineno, name, context)


def _index(index: Any, count: int) -> int:
    # bool is an int to Python, not to the format
    if type(index) is not int or not 0 <= index < count:
        raise ValueError(f"index {index!r} outside a table of {count}")
    return index
