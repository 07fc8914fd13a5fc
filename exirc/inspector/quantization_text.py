"""`exirc inspect --show quantization`: the quantized tensors, one a line.

Rendered from the `quantization` entry of `describe()`, in blocks: each
method's kernel calls (tensors are `%N`, as in the listing), then each of
its delegates (XNNPACK values are `vN`). A line reads

    %21  i8[1, 3, 6, 6]  per-tensor  scale=0.0246133  zp=0  [-128, 127]  \
quantize_per_tensor.out @2 -> dequantize_per_tensor.out @3

that is: the tensor and its type (`as i4` when the integers are packed
narrower than the storage), the scheme, the scale(s) and zero point(s), the
range, and where the tensor comes from -> what reads it: `constant`,
`input`, or the instruction (`@index`, `@chain:index` past chain 0) or node
(`#index`) writing it. Many scales show as their count and range
(`4 scales 0.00144..0.00151`); anything the file leaves unknown is `?`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exirc.inspector.quantization_params import or_unknown, params_text, scheme_text
from exirc.inspector.render import clean, plural

# Readers shown on a line before the rest are counted.
_MAX_USES = 3

Style = Callable[[str], str]


def render_quantization(info: dict[str, Any], bold: Style) -> str:
    tensors = info.get("quantization", {}).get("tensors", [])
    if not tensors:
        return bold("quantization: ") + "none (no quantized kernel calls or XNNPACK values)"
    lines = [bold("quantization: ") + plural(len(tensors), "quantized tensor")]
    blocks: dict[tuple[str, int | None], list[dict[str, Any]]] = {}
    for t in tensors:
        blocks.setdefault((t["method"], t["delegate"]), []).append(t)
    delegate_ids = {(m["name"], d["index"]): d["id"]
                    for m in info.get("methods", []) for d in m.get("delegates", [])}
    for (method, delegate), block in blocks.items():
        if delegate is None:
            head = f"method {clean(method)}, kernel calls"
        else:
            backend = delegate_ids.get((method, delegate), "?")
            head = f"method {clean(method)}, delegate[{delegate}] {clean(backend)}"
        lines.append(f"  {head} ({len(block)}):")
        lines.extend(_table([_row(t) for t in block], "    "))
    return "\n".join(lines)


def _table(rows: list[list[str]], indent: str) -> list[str]:
    """Columns padded to their widest cell; the last column is not padded."""
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]) - 1)]
    return [indent + "  ".join([cell.ljust(w) for cell, w in zip(row, widths)] + row[-1:])
            .rstrip() for row in rows]


def _row(t: dict[str, Any]) -> list[str]:
    xnnpack = t["delegate"] is not None
    name = f"v{t['xnnpack_value']}" if xnnpack else f"%{or_unknown(t['value'])}"
    kind = clean(t["type"])
    dtype = t["dtype"]
    if not xnnpack and dtype and not kind.startswith(dtype + "["):
        kind += f" as {clean(dtype)}"
    return [name, kind, scheme_text(t), params_text("scale", "scales", t["scale"]),
            params_text("zp", "zps", t["zero_point"]), _range(t), clean(_flow(t))]


def _range(t: dict[str, Any]) -> str:
    low, high = t.get("quant_min"), t.get("quant_max")
    if low is None and high is None:
        return "[?]"
    if (low, high) == (-(2 ** 31), 2 ** 31 - 1):
        return "[-2^31, 2^31-1]"  # int32 biases: the digits would widen every row
    return f"[{or_unknown(low)}, {or_unknown(high)}]"


def _flow(t: dict[str, Any]) -> str:
    """Where the tensor comes from -> what reads it."""
    uses = t.get("uses", [])
    writers = [_use(u) for u in uses if u["writes"]]
    readers = [_use(u) for u in uses if not u["writes"]]
    origin = ", ".join(writers) or t.get("origin") or "?"
    if len(readers) > _MAX_USES:
        readers = readers[:_MAX_USES] + [f"+{len(readers) - _MAX_USES} more"]
    return f"{origin} -> {', '.join(readers)}" if readers else origin


def _use(u: dict[str, Any]) -> str:
    if "node" in u:
        text = f"{u['kind']} #{u['node']}"
        return text if u["writes"] else f"{text} {u['arg']}"
    op = u["op"].split("::", 1)[-1]
    where = f"{u['chain']}:{u['index']}" if u["chain"] else str(u["index"])
    return f"{op} @{where}"
