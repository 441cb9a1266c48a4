"""The kernel and collective primitives every mixin of a layer's generator calls, declared once for
the type checker.

`kernels.LayerKernels` (kernels, collectives, kept tensors), `tensor_parallel.TensorParallel` (the
TP linear layers) and `fp8.Fp8Quantization` (casts) define them; the mixins beside them
(attention, MLA, MTP, MoE and its dispatchers, ...) call them through `self`. Each mixin lists
`KernelPrimitives` last among its bases (with the rank's layer state they share): a class of these declarations when type-checking, so
every call and every definition is checked against one signature, and `object` at run time, so
the real definitions are the only ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from chakra_core.et.build import Stream

Attr = tuple[str, str, "int | str | bool | tuple[int, ...]"]
"""A node attribute as (kind: uint, uints, bool or str; name; value), hashable: kernels.kernel_blob
serializes a kernel's attributes once per distinct kernel."""

EP_PART = "ep"
"""step_part of the MoE dispatchers' communication: the step's split shows it as exposed_ep."""

if TYPE_CHECKING:
    from chakra_core.jobs.placement import Placement
    from chakra_core.jobs.spec import JobSpec

    class KernelPrimitives:
        # the rank's layer state LayerKernels sets up
        job: JobSpec
        place: Placement
        stream: Stream
        groups: dict[str, tuple[int, ...]]   # role -> the ranks of this rank's group
        tp: int
        h: int                 # hidden size
        n: int                 # tokens a GEMM sees (micro-batch x local sequence)
        local_tokens: int      # tokens held between layers (n / tp with sequence parallelism)
        act_bytes: int
        gemm_dtype: str        # the data type of the quantized GEMMs (fp8, mxfp8, nvfp4) or the precision
        fp8: bool              # the job's linear layers are quantized (fp8 or nvfp4)
        fp8_transposed: bool   # fp8 tensors read columnwise get a transposed copy (fp8.fp8_transposes)
        linear_fp8: bool       # the GEMMs being written are fp8 (off around the output layer)
        part: str              # step_part of the nodes being written

        def _kernel(self, name: str, kind: str, ops: int, nbytes: int, dtype: str,
                    extra: Iterable[Attr] = ()) -> int:
            raise NotImplementedError

        def elementwise(self, name: str, elements: int, nbytes: int, ops_per: int = 1, dtype: str = "bf16",
                        launches: int = 1, host_sync: bool = False) -> int:
            raise NotImplementedError

        def bmm(self, name: str, batch: int, m: int, k: int, n: int) -> int:
            raise NotImplementedError

        def gemm(self, name: str, m: int, k: int, n: int, cast: bool = False, tp_amax: bool = False,
                 sm_margin: int = 0, accumulate: bool = False, chunks: int = 1) -> int:
            raise NotImplementedError

        def norm(self, name: str, feeds_fp8: bool = True, width: int | None = None) -> int:
            raise NotImplementedError

        def collective(self, name: str, role: str, comm_type: int, size: int, part: str | None = None,
                       after: Sequence[int] | None = None, ctas: int = 0) -> int | None:
            raise NotImplementedError

        def blocking(self, name: str, role: str, comm_type: int, size: int, part: str | None = None) -> None:
            raise NotImplementedError

        @property
        def gemm_in(self) -> int:
            raise NotImplementedError

        @property
        def quantized_copies(self) -> int:
            raise NotImplementedError

        def _keep(self, node: int | None, what: str, elements: int, size: int, output: bool = True) -> None:
            raise NotImplementedError

        def _read(self, node: int | None, *what: str) -> None:
            raise NotImplementedError

        def tp_gather(self, name: str, te: bool = True, width: int | None = None) -> int | None:
            raise NotImplementedError

        def tp_reduce(self, name: str) -> None:
            raise NotImplementedError

        def _gemm_with(self, name: str, m: int, k: int, n: int, gather: bool, cast: bool = False,
                       tp_amax: bool = False, te: bool = True, width: int | None = None) -> int:
            raise NotImplementedError

        def _row_gemm(self, name: str, m: int, k: int, n: int) -> int:
            raise NotImplementedError

        def _row_backward(self, name: str, m: int, k: int, n: int) -> tuple[int, int]:
            raise NotImplementedError

        def _column_backward(self, name: str, m: int, k: int, n: int, te: bool = True,
                             width: int | None = None, grad_kept: bool = False) -> tuple[int, int]:
            raise NotImplementedError

        def quantize(self, name: str, elements: int, tp_amax: bool = False, amax_done: bool = False,
                     splits: int = 1) -> None:
            raise NotImplementedError

        def weight_gradient(self, name: str, dgrad: int, grad_elements: int, make: Callable[[], int]) -> int:
            raise NotImplementedError

        @property
        def fp8_on(self) -> bool:  # quantized GEMMs with TE's overheads (fp8.Fp8Quantization)
            raise NotImplementedError

        @property
        def fp4(self) -> bool:     # NVFP4 (fp8.Fp8Quantization)
            raise NotImplementedError
else:
    KernelPrimitives = object
