"""Which data type a Chakra compute node computes in (for a peak per data type, e.g. the roofline
plugin with a hardware profile).

A node says it in one of two ways, read in this order:

1. a `dtype` attribute (a string): a profile data type (`bf16`, `fp8`, `tf32` ...) or a
   PyTorch / c10 name (`BFloat16`, `c10::BFloat16`, `torch.float16`, `float`, `Tensor(c10::Half)`,
   `Float8_e4m3fn` ...), case-insensitive;
2. the element types of its input tensors (`inputs.types`), as the PyTorch converter and
   `chakra-sim generate transformer` write them: a Python-literal list with one entry per
   operand, such as `['Tensor(c10::BFloat16)', 'Int', 'GenericList[Tensor(float),Tensor(float)]']`,
   with the operand shapes alongside in `inputs.shapes`. Among the floating-point inputs
   (fp64, fp32, fp16, bf16, fp8) the type of the one with the most elements wins, ties going
   to the wider type; integer inputs count only when no input is floating (then int8 if
   one is int8). So fp8 GEMMs with fp32 scale factors are fp8, weight-only int8 GEMMs with
   bf16 activations are bf16, an Adam step reading bf16 gradients and fp32 state of equal size
   is fp32, and indices (int64) never decide anything.

Neither answers for nodes without operands; the PyTorch converter therefore writes the
`dtype` attribute on the GPU kernel it gives an operator's FLOPs (the operands stay on the host
operator's node), using `operands_dtype` on the operator's inputs.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

from chakra_core.et.attrs import NodeView

_WIDTH = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "mxfp8": 1, "nvfp4": 1}
"""Bytes per element, to rank operands (nvfp4's half byte counts as one: only ties depend on it)."""

_NAMES = {
    # profile names
    "fp64": "fp64", "fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "bf16": "bf16", "fp8": "fp8",
    "int8": "int8", "mxfp8": "mxfp8", "nvfp4": "nvfp4",
    # PyTorch dtypes (torch.<name>) and c10 scalar types as execution traces print them
    "float64": "fp64", "double": "fp64",
    "float32": "fp32", "float": "fp32",
    "tensorfloat32": "tf32", "tensorfloat-32": "tf32",
    "float16": "fp16", "half": "fp16",
    "bfloat16": "bf16",
    "char": "int8", "signed char": "int8", "qint8": "int8", "quint8": "int8",
}
_PREFIXES = ("torch.", "at::", "c10::", "scalartype::")
_TENSOR = re.compile(r"Tensor\(([^()]*)\)")


def canonical(name: str) -> str | None:
    """The profile data type `name` stands for: `"c10::BFloat16"` -> `"bf16"`; None when it names
    no data type a profile has a peak for (integers other than int8, bool, complex, unknown)."""
    key = name.strip().lower()
    if key.startswith("tensor(") and key.endswith(")"):
        key = key[7:-1].strip()
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix):]
    found = _NAMES.get(key)
    if found is None and "float8" in key:     # Float8_e4m3fn, Float8_e5m2, Float8_e4m3fnuz ...
        found = "fp8"
    return found


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _elements(shape: Any) -> int | None:
    if isinstance(shape, list) and all(type(d) is int for d in shape):
        return math.prod(shape)
    return None


def _operands(types_text: str, shapes_text: str) -> list[tuple[str, int]]:
    """(element type, number of elements or 0 if unknown) of every tensor among the operands."""
    types = _literal(types_text)
    if not isinstance(types, list):          # not a list literal: take the type names alone
        return [(name, 0) for name in _TENSOR.findall(types_text)]
    shapes = _literal(shapes_text) if shapes_text else None
    if not isinstance(shapes, list) or len(shapes) != len(types):
        shapes = [None] * len(types)
    out = []
    for kind, shape in zip(types, shapes):
        names = _TENSOR.findall(str(kind))
        if len(names) == 1:
            out.append((names[0], _elements(shape) or 0))
        elif names:                           # GenericList[Tensor(..),Tensor(..)]: one shape each
            parts = shape if isinstance(shape, list) and len(shape) == len(names) else [None] * len(names)
            out.extend((name, _elements(part) or 0) for name, part in zip(names, parts))
    return out


def operands_dtype(types_text: str, shapes_text: str) -> str | None:
    """The data type operands with these `inputs.types` / `inputs.shapes` texts compute in (see
    the module docstring), or None."""
    if not types_text:
        return None
    best: tuple[int, int] | None = None
    chosen = None
    int8 = False
    for name, elements in _operands(types_text, shapes_text):
        dtype = canonical(name)
        if dtype == "int8":
            int8 = True
        elif dtype is not None:
            rank = (elements, _WIDTH[dtype])
            if best is None or rank > best:
                best, chosen = rank, dtype
    if chosen is None and int8:
        return "int8"
    return chosen


def input_dtype(node: NodeView) -> str | None:
    """The data type a node's input tensors say it computes in."""
    return operands_dtype(node.pb.inputs.types, node.pb.inputs.shapes)


def node_dtype(node: NodeView) -> tuple[str | None, str | None]:
    """(data type, an unrecognised `dtype` attribute value or None) of a node; the data type is
    None when neither the attribute nor the inputs tell."""
    unknown = None
    if node.has("dtype"):
        raw = node.str("dtype")
        dtype = canonical(raw)
        if dtype is not None:
            return dtype, None
        unknown = raw
    return input_dtype(node), unknown
