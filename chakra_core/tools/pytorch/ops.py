"""What a host operator does to memory: tensors, bytes, writes; which operators are trivial.

Tensors appear in operand values as Chakra's 6-lists
`[tensor_id, storage_id, offset, num_elements, element_size, device]`, possibly nested in
lists (`GenericList[Tensor]`). Bytes come from those lists (exact), else from shapes and
dtypes. What an operator computes (FLOPs) is in `flops`.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any, Iterable, NamedTuple

from chakra_core.tools.pytorch.host import HostOp, Operands


class Tensor(NamedTuple):
    tensor_id: int
    storage_id: int
    offset: int
    num_elem: int
    elem_bytes: int
    device: str

    @property
    def nbytes(self) -> int:
        return self.num_elem * self.elem_bytes

    @property
    def on_host(self) -> bool:
        return self.device in ("cpu", "", "meta")


def as_tensor(value: Any) -> Tensor | None:
    """The Tensor a 6-list stands for, or None if `value` is not one."""
    if (type(value) is list and len(value) == 6 and type(value[5]) is str
            and all(type(v) is int for v in value[:5])):
        return Tensor(*value)
    return None


def _collect(value: Any, out: list[Tensor]) -> None:
    tensor = as_tensor(value)
    if tensor is not None:
        out.append(tensor)
    elif type(value) is list:
        for item in value:
            _collect(item, out)


def arg_tensors(operands: Operands, index: int) -> list[Tensor]:
    """Tensors of one operand (a tensor, a list of tensors, or none)."""
    if index >= len(operands.values):
        return []
    kind = operands.types[index] if index < len(operands.types) else ""
    if kind and "Tensor" not in str(kind):
        return []
    out: list[Tensor] = []
    _collect(operands.values[index], out)
    return out


def tensors(operands: Operands) -> list[Tensor]:
    out: list[Tensor] = []
    for index in range(len(operands.values)):
        out.extend(arg_tensors(operands, index))
    return out


# Dtypes ---------------------------------------------------------------------------------------
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "c10::half": 2,
    "bfloat16": 2, "c10::bfloat16": 2, "long": 8, "int64": 8, "long int": 8, "int": 4, "int32": 4,
    "short": 2, "int16": 2, "signed char": 1, "char": 1, "int8": 1, "unsigned char": 1, "byte": 1,
    "uint8": 1, "bool": 1, "c10::complex<float>": 8, "complexfloat": 8, "complex64": 8,
    "c10::complex<double>": 16, "complexdouble": 16, "complex128": 16, "c10::complex<c10::half>": 4,
    "complexhalf": 4, "unsigned short": 2, "uint16": 2, "unsigned int": 4, "uint32": 4,
    "unsigned long": 8, "uint64": 8, "qint8": 1, "quint8": 1, "qint32": 4,
}


def dtype_bytes(name: str) -> int | None:
    """Bytes of one element of a dtype named as in ET types (`Tensor(c10::Half)` -> 'c10::Half')
    or in `record_param_comms` attributes ('BFloat16')."""
    key = name.strip().lower()
    if key.startswith("tensor(") and key.endswith(")"):
        key = key[7:-1]
    if key in _DTYPE_BYTES:
        return _DTYPE_BYTES[key]
    if "float8" in key:
        return 1
    return None


def shape_bytes(shape: Any, kind: Any) -> int:
    """Bytes of a tensor known only by its shape and type string (0 if either is unusable)."""
    size = dtype_bytes(str(kind)) if kind else None
    if size is None or not isinstance(shape, list) or not all(type(d) is int for d in shape):
        return 0
    return math.prod(shape) * size


def operand_bytes(operands: Operands) -> int:
    """Bytes of every tensor operand: from the tensor 6-lists, else from shapes and dtypes."""
    total = 0
    for index, value in enumerate(operands.values):
        found = arg_tensors(operands, index)
        if found:
            total += sum(t.nbytes for t in found)
        elif index < len(operands.types) and str(operands.types[index]).startswith("Tensor("):
            shape = operands.shapes[index] if index < len(operands.shapes) else None
            total += shape_bytes(shape, operands.types[index])
    return total


# Operator classes -----------------------------------------------------------------------------
TRIVIAL_OPS = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::_reshape_alias",
    "aten::as_strided", "aten::t", "aten::transpose", "aten::permute", "aten::expand",
    "aten::expand_as", "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze",
    "aten::detach", "aten::detach_", "detach", "detach_", "aten::alias", "aten::_unsafe_view",
    "aten::unfold", "aten::narrow", "aten::split", "aten::split_with_sizes", "aten::chunk",
    "aten::unbind", "aten::result_type", "aten::resize_", "aten::set_", "aten::lift_fresh",
    "aten::is_same_size", "aten::is_pinned", "aten::resolve_conj", "aten::resolve_neg",
    "aten::record_stream", "aten::size", "aten::stride", "aten::numel", "aten::dim",
    "aten::broadcast_tensors", "aten::view_as", "aten::_has_compatible_shallow_copy_type",
    "aten::is_nonzero", "aten::_nested_tensor_from_mask_left_aligned", "aten::lift",
    "aten::_to_dim_order_copy_noop", "aten::unsafe_split", "aten::movedim", "aten::diagonal",
    "aten::reshape_as", "aten::_shape_as_tensor", "aten::sym_size", "aten::sym_stride",
})
"""Operators that only create, resize or re-view tensors: no arithmetic, no kernel, no data write."""

_OPERATOR_NAME = re.compile(r"^[A-Za-z_][\w.]*::[A-Za-z_]\w*(\.\w+)?$")


def is_trivial(name: str) -> bool:
    return name in TRIVIAL_OPS


def is_operator(op: HostOp) -> bool:
    """A dispatcher operator or compiled kernel, as opposed to a user annotation / autograd label."""
    return bool(op.op_schema) or bool(op.attrs.get("kernel_backend")) or bool(_OPERATOR_NAME.match(op.name))


def is_compiled_kernel(op: HostOp) -> bool:
    """A torch.compile (Inductor) kernel: its schema is unknown and it returns nothing."""
    return op.attrs.get("kernel_backend") == "triton" or op.name.startswith("triton_")


def written_inputs(op: HostOp) -> list[int]:
    """Indices of the inputs an operator writes (alias annotations `(a!)` in its schema; else a
    trailing underscore means the first tensor operand; compiled kernels write every tensor)."""
    if is_trivial(op.name):
        return []
    if is_compiled_kernel(op):
        return list(range(len(op.inputs.values)))
    if op.op_schema:
        return list(_mutated_positions(op.op_schema))
    base = op.name.split("::")[-1]
    if base.endswith("_") and not base.endswith("__"):
        for index in range(len(op.inputs.values)):
            if arg_tensors(op.inputs, index):
                return [index]
    return []


@lru_cache(maxsize=4096)
def _mutated_positions(schema: str) -> tuple[int, ...]:
    start = schema.find("(")
    end = schema.rfind(") ->")
    if start < 0 or end < start:
        return ()
    args, depth, current = [], 0, ""
    for char in schema[start + 1:end]:
        if char == "," and depth == 0:
            args.append(current)
            current = ""
            continue
        depth += char in "([<"
        depth -= char in ")]>"
        current += char
    args.append(current)
    positions, index = [], 0
    for arg in args:
        if arg.strip() == "*":
            continue
        if "!" in arg.strip().split(" ")[0]:
            positions.append(index)
        index += 1
    return tuple(positions)


def sum_bytes(items: Iterable[Tensor]) -> int:
    return sum(t.nbytes for t in items)
