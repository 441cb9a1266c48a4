"""What a host operator computes: FLOP estimates (`num_ops`) from operand shapes.

FLOP estimates follow the usual conventions (a multiply-add is 2 FLOPs):

| family | operators | num_ops |
| --- | --- | --- |
| matmul | mm, addmm, _addmm_activation, bmm, baddbmm, matmul, linear, mv, addmv, dot, _scaled_mm | 2·batch·M·N·K |
| conv | convolution, _convolution, conv1d/2d/3d, cudnn/mkldnn/miopen convolutions, conv_transpose* | 2·N·∏(out spatial)·∏(weight) (transposed: ∏(in spatial)) |
| conv backward | convolution_backward (×(grad_input + grad_weight) from output_mask), cudnn_convolution_backward_{input,weight} | the forward figure per gradient |
| attention | scaled_dot_product_attention and its flash / efficient / cudnn kernels | 2·B·H·L·S·(E + Ev) |
| pointwise, reduction | add, mul, relu, threshold_backward, sum, mean, ... | elements (×5 for softmax and norms) |

Anything else keeps its duration only (no `num_ops`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from chakra_core.tools.pytorch.host import HostOp, Operands
from chakra_core.tools.pytorch.ops import arg_tensors, tensors


class Estimate(NamedTuple):
    num_ops: int | None
    family: str
    problem: str | None = None
    """Why a recognised operator got no estimate (shapes missing or inconsistent)."""


_MATMUL = {"aten::mm", "aten::addmm", "aten::_addmm_activation", "aten::bmm", "aten::baddbmm",
           "aten::matmul", "aten::linear", "aten::mv", "aten::addmv", "aten::dot", "aten::_scaled_mm",
           "aten::addbmm"}
_CONV = {"aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d",
         "aten::cudnn_convolution", "aten::cudnn_convolution_relu", "aten::cudnn_convolution_add_relu",
         "aten::mkldnn_convolution", "aten::miopen_convolution", "aten::convolution_overrideable",
         "aten::_slow_conv2d_forward", "aten::slow_conv3d_forward", "aten::thnn_conv2d",
         "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d",
         "aten::cudnn_convolution_transpose", "aten::miopen_convolution_transpose",
         "aten::slow_conv_transpose2d", "aten::slow_conv_transpose3d", "aten::_convolution_mode",
         "aten::_nnpack_spatial_convolution"}
_CONV_BACKWARD = {"aten::convolution_backward", "aten::convolution_backward_overrideable",
                  "aten::cudnn_convolution_backward_input", "aten::cudnn_convolution_backward_weight",
                  "aten::_slow_conv2d_backward"}
_ATTENTION = {"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
              "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
              "aten::_flash_attention_forward", "aten::_efficient_attention_forward",
              "aten::_scaled_dot_product_attention_math"}
_POINTWISE = {"add", "sub", "mul", "div", "relu", "threshold_backward", "clamp", "clamp_min",
              "clamp_max", "gelu", "gelu_backward", "silu", "silu_backward", "sigmoid",
              "sigmoid_backward", "tanh", "tanh_backward", "neg", "sqrt", "rsqrt", "exp", "log", "pow",
              "addcmul", "addcdiv", "lerp", "where", "masked_fill", "hardtanh", "leaky_relu", "abs",
              "reciprocal", "sin", "cos", "erf", "maximum", "minimum", "remainder", "fmod", "sign",
              "square", "rsub", "dropout", "native_dropout", "native_dropout_backward",
              "mse_loss_backward", "elu", "softplus", "hardswish", "hardsigmoid", "log_sigmoid_forward"}
_REDUCTION = {"sum", "mean", "amax", "amin", "max", "min", "norm", "linalg_vector_norm", "var",
              "std", "prod", "mse_loss", "nll_loss_forward", "nll_loss2d_forward", "argmax", "argmin",
              "logsumexp", "cumsum", "nll_loss_backward", "embedding_dense_backward"}
_FIVE_PER_ELEMENT = {"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
                     "native_layer_norm", "native_layer_norm_backward", "native_batch_norm",
                     "native_batch_norm_backward", "cudnn_batch_norm", "cudnn_batch_norm_backward",
                     "_batch_norm_impl_index", "native_group_norm", "native_group_norm_backward",
                     "_fused_rms_norm", "batch_norm_backward", "_native_batch_norm_legit",
                     "_native_batch_norm_legit_no_training", "miopen_batch_norm"}
FLOP_OPS = frozenset(_MATMUL | _CONV | _CONV_BACKWARD | _ATTENTION)
"""Operators whose FLOPs come from a shape formula (used to decide which scope carries them)."""


def estimate(op: HostOp) -> Estimate:
    """num_ops of an operator from its shapes; `num_ops` None when there is no formula or the
    shapes do not fit it (then `problem` says why)."""
    name = op.name
    try:
        if name in _MATMUL:
            return _matmul(op)
        if name in _CONV:
            return _conv(op)
        if name in _CONV_BACKWARD:
            return _conv_backward(op)
        if name in _ATTENTION:
            return _attention(op)
    except (TypeError, ValueError, IndexError) as exc:
        family = "attention" if name in _ATTENTION else "conv" if "conv" in name else "matmul"
        return Estimate(None, family, f"shapes {_shapes(op.inputs)} do not fit the formula ({exc})")
    base = name.split("::")[-1].rstrip("_") if name.startswith("aten::") else ""
    if base.startswith("_foreach_"):
        elements = sum(t.num_elem for t in arg_tensors(op.inputs, 0))
        return Estimate(elements, "pointwise")
    if base in _POINTWISE:
        return Estimate(_elements(op.outputs) or _elements(op.inputs), "pointwise")
    if base in _REDUCTION:
        return Estimate(_elements(op.inputs), "reduction")
    if base in _FIVE_PER_ELEMENT:
        return Estimate(5 * _elements(op.inputs), "softmax" if "softmax" in base else "norm")
    return Estimate(None, "other")


def _shapes(operands: Operands) -> list[Any]:
    return [s for s, t in zip(operands.shapes, operands.types) if str(t).startswith("Tensor")]


def _elements(operands: Operands) -> int:
    found = tensors(operands)
    if found:
        return max(t.num_elem for t in found)
    sizes = [math.prod(s) for s in _shapes(operands) if isinstance(s, list) and all(type(d) is int for d in s)]
    return max(sizes, default=0)


def _dims(operands: Operands, index: int) -> list[int]:
    shape = operands.shapes[index]
    if not isinstance(shape, list) or not shape or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"operand {index} has no tensor shape")
    return shape


def _matmul(op: HostOp) -> Estimate:
    name, ins = op.name, op.inputs
    if name in ("aten::mm", "aten::_scaled_mm"):
        (m, k), (k2, n) = _dims(ins, 0), _dims(ins, 1)
        return _mmk(1, m, n, k, k2)
    if name in ("aten::addmm", "aten::_addmm_activation"):
        (m, k), (k2, n) = _dims(ins, 1), _dims(ins, 2)
        return _mmk(1, m, n, k, k2)
    if name == "aten::bmm":
        (b, m, k), (b2, k2, n) = _dims(ins, 0), _dims(ins, 1)
        return _mmk(max(b, b2), m, n, k, k2)
    if name in ("aten::baddbmm", "aten::addbmm"):
        (b, m, k), (b2, k2, n) = _dims(ins, 1), _dims(ins, 2)
        return _mmk(max(b, b2), m, n, k, k2)
    if name == "aten::mv":
        (m, k), (k2,) = _dims(ins, 0), _dims(ins, 1)
        return _mmk(1, m, 1, k, k2)
    if name == "aten::addmv":
        (m, k), (k2,) = _dims(ins, 1), _dims(ins, 2)
        return _mmk(1, m, 1, k, k2)
    if name == "aten::dot":
        (k,), (k2,) = _dims(ins, 0), _dims(ins, 1)
        return _mmk(1, 1, 1, k, k2)
    if name == "aten::linear":
        x, w = _dims(ins, 0), _dims(ins, 1)
        n, k = (w[0], w[1]) if len(w) == 2 else (1, w[0])
        return _mmk(math.prod(x[:-1]), 1, n, x[-1], k)
    lhs, rhs = _dims(ins, 0), _dims(ins, 1)  # aten::matmul, with broadcasting
    if len(lhs) == 1:
        lhs = [1] + lhs
    if len(rhs) == 1:
        rhs = rhs + [1]
    batch_a, batch_b = lhs[:-2], rhs[:-2]
    width = max(len(batch_a), len(batch_b))
    batch_a = [1] * (width - len(batch_a)) + batch_a
    batch_b = [1] * (width - len(batch_b)) + batch_b
    batch = math.prod(max(x, y) for x, y in zip(batch_a, batch_b))
    return _mmk(batch, lhs[-2], rhs[-1], lhs[-1], rhs[-2])


def _mmk(batch: int, m: int, n: int, k: int, k2: int) -> Estimate:
    if k != k2:
        raise ValueError(f"inner dimensions {k} and {k2} differ")
    return Estimate(2 * batch * m * n * k, "matmul")


def _conv(op: HostOp) -> Estimate:
    ins = op.inputs
    x, w = _dims(ins, 0), _dims(ins, 1)
    if len(w) < 3 or len(x) < len(w) - 1:
        raise ValueError("input/weight ranks do not fit a convolution")
    batched = len(x) == len(w)
    batch = x[0] if batched else 1
    spatial_in = x[-(len(w) - 2):]
    transposed = "transpose" in op.name or (
        op.name in ("aten::convolution", "aten::_convolution", "aten::convolution_overrideable")
        and len(ins.values) > 6 and ins.values[6] is True)
    if transposed:
        return Estimate(2 * batch * math.prod(spatial_in) * math.prod(w), "conv")
    out_shapes = [s for s in _shapes(op.outputs) if isinstance(s, list) and len(s) == len(x)]
    if out_shapes:
        spatial_out = out_shapes[0][-(len(w) - 2):]
    else:
        spatial_out = _conv_out(op, spatial_in, w[2:])
    return Estimate(2 * batch * math.prod(spatial_out) * math.prod(w), "conv")


def _conv_out(op: HostOp, spatial_in: list[int], kernel: list[int]) -> list[int]:
    """Output size from stride/padding/dilation (positions 3, 4, 5 of conv and convolution)."""
    values = op.inputs.values

    def arg(index: int, default: int) -> list[int]:
        value = values[index] if index < len(values) else None
        if isinstance(value, int):
            return [value] * len(kernel)
        if isinstance(value, list) and value and all(type(v) is int for v in value):
            return value if len(value) == len(kernel) else value[:1] * len(kernel)
        return [default] * len(kernel)
    stride, padding, dilation = arg(3, 1), arg(4, 0), arg(5, 1)
    return [(i + 2 * p - d * (k - 1) - 1) // s + 1
            for i, k, s, p, d in zip(spatial_in, kernel, stride, padding, dilation)]


def _conv_backward(op: HostOp) -> Estimate:
    ins = op.inputs
    if op.name in ("aten::cudnn_convolution_backward_input", "aten::cudnn_convolution_backward_weight"):
        grad, w = _dims(ins, 1), _dims(ins, 2)  # (self_size|self, grad_output, weight, ...)
        return Estimate(2 * grad[0] * math.prod(grad[2:]) * math.prod(w), "conv")
    grad, x, w = _dims(ins, 0), _dims(ins, 1), _dims(ins, 2)
    transposed = len(ins.values) > 7 and ins.values[7] is True
    spatial = x[2:] if transposed else grad[2:]
    forward = 2 * grad[0] * math.prod(spatial) * math.prod(w)
    mask = ins.values[-1] if ins.values and isinstance(ins.values[-1], list) else [True, True, True]
    gradients = sum(1 for flag in mask[:2] if flag is True)
    return Estimate(forward * gradients, "conv")


def _attention(op: HostOp) -> Estimate:
    q, k, v = _dims(op.inputs, 0), _dims(op.inputs, 1), _dims(op.inputs, 2)
    if len(q) < 2 or len(k) < 2 or len(v) < 2:
        raise ValueError("attention operands need at least 2 dimensions")
    batch = math.prod(q[:-2])
    length, source, embed, value_embed = q[-2], k[-2], q[-1], v[-1]
    return Estimate(2 * batch * length * source * (embed + value_embed), "attention")
