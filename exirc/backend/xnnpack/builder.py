"""GraphBuilder: the XNNPACK graph of one partition, while it is being built.

It owns the value table, the weights (named data keyed by the sha256 of
their bytes, as ExecuTorch keys them) and, for each fx node, the physical
copies ("versions") of its tensor that exist so far, each in a layout
(`layout.Layout`). Emitters ask for an operand in the layout they need and
the builder reuses a version, reshapes one that has the same bytes, or
transposes one; so transposes appear only where an operator needs an order
that no copy has, and permutes of the model cost nothing until then.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.fx import Node

from exirc.backend.xnnpack import layout as lay
from exirc.backend.xnnpack.args import shape
from exirc.backend.xnnpack.layout import Layout
from exirc.errors import InternalError
from exirc.serialize.xnnpack import graph as G

_VIEW = torch.ops.aten.view_copy.default
_SIZE = torch.ops.aten.sym_size.int

# Node kinds whose output_min_max XNNPACK applies (ExecuTorch's runtime passes
# it to these defines only): where a following clamp can be fused.
CLAMPABLE = frozenset({
    G.NodeKind.ADD, G.NodeKind.SUBTRACT, G.NodeKind.MULTIPLY, G.NodeKind.DIV,
    G.NodeKind.FULLY_CONNECTED, G.NodeKind.CONV2D, G.NodeKind.DEPTHWISE_CONV2D,
    G.NodeKind.CONV_TRANSPOSE2D, G.NodeKind.AVG_POOLING_2D, G.NodeKind.MAX_POOLING_2D,
    G.NodeKind.GLOBAL_AVG_POOLING_2D, G.NodeKind.CLAMP,
})


@dataclass(frozen=True)
class Version:
    """One physical copy of an fx node's tensor: value `id`, stored in `layout`."""

    id: int
    layout: Layout


Operand = Node | torch.Tensor


def shape_of(x: Operand) -> list[int]:
    """The logical shape of an operand (output 0 of a multi-output node)."""
    if isinstance(x, torch.Tensor):
        return [int(d) for d in x.shape]
    return shape(x)


@dataclass
class GraphBuilder:
    """Backend-dialect partition -> XNNGraph, value by value (the emitters drive
    it); `constants` are the partition's weights by placeholder name."""

    constants: dict[str, torch.Tensor]
    graph: G.XNNGraph = field(default_factory=G.XNNGraph)
    named_data: dict[str, bytes] = field(default_factory=dict)
    debug_handle: int = 0  # of the fx node being emitted; stamped on its XNNPACK nodes
    _versions: dict[Node, list[Version]] = field(default_factory=dict)
    _alias: dict[Node, Node] = field(default_factory=dict)
    _folded: dict[Node, torch.Tensor] = field(default_factory=dict)
    # Folded quantizes: their tensors are integers, stored as qint8 with this.
    _folded_quant: dict[Node, G.PerTensorQuant] = field(default_factory=dict)
    _static_ids: dict[tuple[str, tuple[int, ...], G.Datatype, str], int] = field(
        default_factory=dict)
    _data_index: dict[str, int] = field(default_factory=dict)
    producer: dict[int, G.Node] = field(default_factory=dict)   # value id -> its node
    owner: dict[int, Node] = field(default_factory=dict)        # value id -> fx node made for
    externals: set[int] = field(default_factory=set)
    # fx nodes an earlier emitter did the work of (a batch norm folded into its
    # convolution): their own emitter only aliases them.
    fused: set[Node] = field(default_factory=set)
    # fx nodes inside a decomposed operator emitted whole (patterns.py): skipped.
    absorbed: set[Node] = field(default_factory=set)
    # fp32 value id -> its per-token qdint8 Convert: the linear layers reading one
    # input (a layer's q, k and v) share one, as each node costs a call's time.
    per_token: dict[int, int] = field(default_factory=dict)

    # --- what an fx node is ------------------------------------------------

    def resolve(self, node: Node) -> Node:
        while node in self._alias:
            node = self._alias[node]
        return node

    def static(self, x: Operand) -> torch.Tensor | None:
        """The tensor of a node known at compile time (a weight or a folded value)."""
        if isinstance(x, torch.Tensor):
            return x
        node = self.resolve(x)
        if node in self._folded:
            return self._folded[node]
        if node.op == "placeholder" and node.target in self.constants:
            return self.constants[str(node.target)]
        return None

    def is_static(self, x: Operand) -> bool:
        return self.static(x) is not None

    def is_defined(self, node: Node) -> bool:
        return node in self._alias or node in self._versions or node in self._folded

    def versions(self, node: Node) -> list[Version]:
        return self._versions.get(self.resolve(node), [])

    # --- defining values -----------------------------------------------------

    def value(self, dims: Sequence[int], like: int | None = None) -> int:
        """A new internal value: fp32, or of the datatype and quantization of
        value `like` (a copy of a qint8 tensor in another layout stays qint8)."""
        vid = len(self.graph.values)
        datatype, quant = G.Datatype.FP32, None
        if like is not None:
            datatype, quant = self.graph.values[like].datatype, self.graph.values[like].quant
        self.graph.values.append(G.TensorValue(datatype, [int(d) for d in dims], vid,
                                               quant=quant))
        return vid

    def static_value(self, tensor: torch.Tensor) -> int:
        """A constant value holding `tensor` as stored (contiguous fp32).

        Its bytes go to named data under their sha256, so identical weights,
        here or in another delegate of the program, are stored once.
        """
        data = tensor.detach().to(torch.float32).contiguous().cpu()
        return self.constant_value(data, G.Datatype.FP32)

    def constant_value(self, data: torch.Tensor, datatype: G.Datatype,
                       quant: G.Quantization | None = None) -> int:
        """A constant value of `datatype` holding `data`'s bytes as stored
        (int8 for qint8 and qcint8, int32 for qint32 and qcint32)."""
        data = data.detach().contiguous().cpu()
        raw = data.numpy().tobytes() if data.numel() else b""
        dims = tuple(int(d) for d in data.shape)
        index = (hashlib.sha256(raw).hexdigest(), dims, datatype, repr(quant))
        if index in self._static_ids:
            return self._static_ids[index]
        vid = len(self.graph.values)
        self.graph.values.append(G.TensorValue(datatype, list(dims), vid, quant=quant,
                                               constant_buffer_idx=self.constant_entry(raw)))
        self._static_ids[index] = vid
        return vid

    def constant_entry(self, raw: bytes, prefix: str = "") -> int:
        """The constant_data index of `raw`, stored once in named data under
        prefix + its sha256 (ExecuTorch keys quantization scales "scale_<sha>")."""
        key = prefix + hashlib.sha256(raw).hexdigest()
        if key not in self._data_index:
            self._data_index[key] = len(self.graph.constant_data)
            self.graph.constant_data.append(
                G.ConstantDataOffset(G.NAMED_DATA_OFFSET, len(raw), key))
            self.named_data[key] = raw
        return self._data_index[key]

    def external_input(self, node: Node, external_id: int) -> None:
        vid = self.value(shape_of(node))
        tensor = self.graph.values[vid]
        tensor.external_id, tensor.flags = external_id, G.FLAG_EXTERNAL_INPUT
        self.graph.input_ids.append(vid)
        self.externals.add(vid)
        self.define(node, vid, lay.identity(len(tensor.dims)))

    def add_node(self, kind: G.NodeKind, params: G.NodeParams, *,
                 owner: Node | None = None,
                 min_max: tuple[float, float] | None = None) -> G.Node:
        xnode = G.Node(kind, params, self.debug_handle, min_max)
        self.graph.nodes.append(xnode)
        out = params.output_value_id if isinstance(params, G.ArgMaxPooling2d) \
            else params.output_id
        self.producer[out] = xnode
        if owner is not None:
            self.owner[out] = owner
        return xnode

    def define(self, node: Node, vid: int, layout: Sequence[int]) -> None:
        """Record that value `vid` holds `node`'s tensor stored in `layout`."""
        node = self.resolve(node)
        if len(layout) != len(self.graph.values[vid].dims):
            raise InternalError(f"xnnpack: layout {tuple(layout)} does not fit value {vid} "
                                f"of dims {self.graph.values[vid].dims}, please report")
        self._versions.setdefault(node, []).append(Version(vid, tuple(layout)))

    def alias(self, node: Node, same_as: Node) -> None:
        """`node` is the same tensor as `same_as` (a no-op of the graph)."""
        self._alias[node] = self.resolve(same_as)

    def fold(self, node: Node, tensor: torch.Tensor,
             quant: G.PerTensorQuant | None = None) -> None:
        """`node`'s tensor is known at compile time: integers quantized as `quant`
        (a quantize of a constant), else float values."""
        self._folded[node] = tensor
        if quant is not None:
            self._folded_quant[node] = quant

    def _constant_of(self, x: Operand, tensor: torch.Tensor) -> int:
        """The constant value of `tensor`, `x`'s static tensor (or a view of it):
        qint8 for a folded quantize, whose integers read as floats would be
        other numbers, else fp32."""
        quant = self._folded_quant.get(self.resolve(x)) if isinstance(x, Node) else None
        if quant is None:
            return self.static_value(tensor)
        return self.constant_value(tensor.contiguous(), G.Datatype.QINT8, quant)

    # --- getting operands ----------------------------------------------------

    def get(self, x: Operand, layout: Sequence[int] | None = None) -> Version:
        """`x` stored in `layout` (any existing copy when None)."""
        tensor = self.static(x)
        if tensor is not None:
            order = tuple(range(tensor.dim())) if layout is None else tuple(layout)
            return Version(self._constant_of(x, tensor.permute(order)), order)
        assert isinstance(x, Node)
        versions = self.versions(x)
        if not versions:
            raise InternalError(f"xnnpack: {x.name} is used before it is defined, please report")
        if layout is None:
            return versions[0]
        layout = tuple(layout)
        for version in versions:
            if version.layout == layout:
                return version
        out = self._convert(x, layout)
        self.define(x, out, layout)
        return Version(out, layout)

    def _convert(self, x: Node, layout: Layout, out: int | None = None) -> int:
        """A copy of `x` in `layout` from an existing one: a reshape of a copy
        with the same bytes, else a transpose. Written into `out` if given."""
        shape, versions = shape_of(x), self.versions(x)
        dims = lay.physical_shape(shape, layout)
        same = next((v for v in versions if lay.same_memory(shape, v.layout, layout)), None)
        if same is not None:
            if out is None:
                return self.reshape(same.id, dims)
            self.add_node(G.NodeKind.STATIC_RESHAPE, G.StaticReshape(len(dims), dims, same.id, out))
            return out
        source = versions[0]
        out = self.value(dims, like=source.id) if out is None else out
        perm = lay.transpose_perm(source.layout, layout)
        self.add_node(G.NodeKind.STATIC_TRANSPOSE,
                      G.StaticTranspose(len(perm), perm, source.id, out))
        return out

    def get_contiguous(self, x: Operand) -> int:
        """`x` with the bytes PyTorch would have (a copy in a same-memory layout
        if there is one), for operators that read plain row-major tensors."""
        if not self.is_static(x):
            assert isinstance(x, Node)
            shape = shape_of(x)
            ident = lay.identity(len(shape))
            for version in self.versions(x):
                if lay.same_memory(shape, version.layout, ident) \
                        and lay.physical_shape(shape, version.layout) == shape:
                    return version.id
        return self.get(x, lay.identity(len(shape_of(x)))).id

    def broadcast_operand(self, x: Operand, layout: Layout) -> int:
        """`x` ready to broadcast against a value of rank len(layout) stored in
        `layout`: XNNPACK broadcasts trailing physical axes, as numpy does."""
        rank, shape = len(layout), shape_of(x)
        small = len(shape)
        if small == rank:
            return self.get(x, layout).id
        tensor = self.static(x)
        if tensor is not None:
            full = tensor.reshape([1] * (rank - small) + shape).permute(layout)
            return self._constant_of(x, full)
        version = self.get(x, lay.project(layout, rank, small))
        if lay.trailing_compatible(layout, rank, small):
            return version.id
        return self.reshape(version.id, lay.physical_shape([1] * (rank - small) + shape, layout))

    def unary_op(self, kind: G.NodeKind, vid: int, owner: Node | None = None) -> int:
        """kind(value `vid`), a new value of the same dims."""
        out = self.value(self.graph.values[vid].dims)
        self.add_node(kind, G.Node1x1(vid, out), owner=owner)
        return out

    def binary_op(self, kind: G.NodeKind, first: int, second: int,
                  owner: Node | None = None) -> int:
        """kind(`first`, `second`) of two values, broadcast as numpy does."""
        dims = list(torch.broadcast_shapes(tuple(self.graph.values[first].dims),
                                           tuple(self.graph.values[second].dims)))
        out = self.value(dims)
        self.add_node(kind, G.Node2x1(first, second, out), owner=owner)
        return out

    def reshape(self, vid: int, dims: Sequence[int]) -> int:
        """A reshape of value `vid` (same bytes) to `dims`; no node if nothing changes."""
        dims = [int(d) for d in dims]
        if self.graph.values[vid].dims == dims:
            return vid
        producer = self.producer.get(vid)
        if producer is not None and producer.kind == G.NodeKind.STATIC_RESHAPE:
            # A reshape of a reshape is one reshape of the first one's input
            # (the middle one goes if nothing else reads it).
            assert isinstance(producer.params, G.StaticReshape)
            return self.reshape(producer.params.input_id, dims)
        out = self.value(dims, like=vid)
        self.add_node(G.NodeKind.STATIC_RESHAPE, G.StaticReshape(len(dims), dims, vid, out))
        return out

    # --- fused activations ---------------------------------------------------

    def fusable_producer(self, node: Node, source: Node) -> G.Node | None:
        """The XNNPACK node that computes `source`, if `node` (a clamp of
        source) can become its output_min_max: nothing else reads the value."""
        chain = [source]
        while chain[-1] in self._alias:
            chain.append(self._alias[chain[-1]])
        if any(len(n.users) != 1 for n in chain):
            return None
        versions = self.versions(source)
        if len(versions) != 1 or versions[0].id in self.externals:
            return None
        vid = versions[0].id
        producer = self.producer.get(vid)
        if producer is None or self._maker(chain[-1], vid) is not self.owner.get(vid) \
                or producer.kind not in CLAMPABLE:
            return None
        return producer

    def _maker(self, node: Node, vid: int) -> Node:
        """The fx node whose lowering made value `vid`, from `node`, which holds it:
        back through reshapes, each of a node whose values it alone reads (a dynamic
        linear's 2-D result viewed back to 3-D is its value again, `reshape`; its
        size may be read too), so that nothing else reads the value."""
        while self.owner.get(vid) is not node and node.target is _VIEW and \
                isinstance(node.args[0], Node) and \
                all(u is node or u.target is _SIZE for u in node.args[0].users):
            node = node.args[0]
        return node

    # --- results -------------------------------------------------------------

    def mark_output(self, node: Node, external_id: int) -> None:
        """Make `node`'s tensor, in PyTorch's layout, external output `external_id`.

        The value computing it becomes the output when it is plainly laid out
        and nothing else claims it; otherwise the last conversion (or a copy)
        writes the output directly."""
        shape = shape_of(node)
        ident = lay.identity(len(shape))
        found = None
        if not self.is_static(node):
            found = next((v.id for v in self.versions(node)
                          if self.graph.values[v.id].dims == shape
                          and lay.same_memory(shape, v.layout, ident)), None)
        if found is not None and found not in self.externals and found in self.producer:
            vid = found
        else:
            # A qint8 result (a quantize read by another delegate) stays qint8.
            like = self.get(node, ident).id if self.is_static(node) \
                else self.versions(node)[0].id
            vid = self.value(shape, like=like)
            if found is None and not self.is_static(node):
                self._convert(node, ident, vid)
                self.define(node, vid, ident)  # a second output of it copies this one
            else:
                source = found if found is not None else self.get(node, ident).id
                self.add_node(G.NodeKind.COPY, G.Node1x1(source, vid))
        tensor = self.graph.values[vid]
        tensor.external_id, tensor.flags = external_id, G.FLAG_EXTERNAL_OUTPUT
        self.graph.output_ids.append(vid)
        self.externals.add(vid)

    def op_kinds(self) -> dict[str, int]:
        return dict(Counter(n.kind.name for n in self.graph.nodes))

    def weight_bytes(self) -> int:
        return sum(len(data) for data in self.named_data.values())
