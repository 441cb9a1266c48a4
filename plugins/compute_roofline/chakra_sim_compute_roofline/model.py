"""The roofline model: time = num_ops / min(peak, bandwidth x operational intensity).

The peak is either one number (`peak_tflops`, as ASTRA-sim's `peak-perf`) or a hardware
profile's peak for the data type each node computes in (`profile`; `chakra_core.et.dtypes` says
how a node's data type is found).
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import (Field, PositiveFloat, SerializerFunctionWrapHandler, ValidationError, field_validator,
                      model_serializer, model_validator)
from pydantic_core import InitErrorDetails, PydanticCustomError

from chakra_core import JsonObject
from chakra_core import (
    PEAK_DTYPES, AstraEquivalent, ComputeModel, LayerContext, NodeView, PluginConfig, Profile, SimulationError,
    ValidationInputs, load_profile, node_dtype, profile_problems, shipped_or_file,
)

_NONE, _MEMORY, _COMPUTE = range(3)
_SLOT = {dtype: index for index, dtype in enumerate(PEAK_DTYPES)}

DEFAULT_DTYPE = "bf16"
"""The data type of nodes that do not tell theirs, when a profile is given and `dtype` is not."""


def _key_error(key: str, value: Any, message: str) -> ValidationError:
    """A ValidationError located at `key`, so the manifest loader reports `compute.<key>`."""
    return ValidationError.from_exception_data("RooflineConfig", [InitErrorDetails(
        type=PydanticCustomError("roofline_config", message), loc=(key,), input=value)])


class RooflineConfig(PluginConfig):
    peak_tflops: PositiveFloat | None = Field(
        None, description="one peak for every node in TFLOP/s (10^12 FLOP/s), as ASTRA-sim's peak-perf; "
                          "give this or profile, exactly one")
    memory_bandwidth_gbps: PositiveFloat | None = Field(
        None, description="memory bandwidth in GB/s (10^9 B/s). Precedence: this key, else the memory "
                          "layer's bandwidth (per rank), else the profile's HBM bandwidth "
                          "(gpu.memory_bandwidth_gbps); one of them is required")
    profile: str | None = Field(
        None, description="a peak per data type instead of peak_tflops: a shipped hardware profile "
                          "(h100-sxm-hgx, ...) or a .yaml file relative to the manifest; each node is "
                          "timed at the peak of its data type (node attribute dtype, else the types of "
                          "its input tensors, else the dtype key)")
    # The ignore (valid-type): a Literal of the core's tuple of names, which pydantic reads at run time
    # and mypy cannot (mypy takes literal values only).
    dtype: Literal[PEAK_DTYPES] | None = Field(  # type: ignore[valid-type]
        None, description=f"with profile: the data type of nodes that do not tell theirs, and of nodes "
                          f"whose data type the profile has no peak for (a warning names it); "
                          f"null = {DEFAULT_DTYPE}")
    fp32_as_tf32: bool = Field(
        False, description="with profile: time fp32 nodes at the tf32 peak, as PyTorch does with "
                           "torch.backends.cuda.matmul.allow_tf32 = True (its default since 1.12 is "
                           "false for matmuls; cuDNN convolutions default to TF32)")

    @field_validator("profile")
    @classmethod
    def _shipped_or_file(cls, value: str | None) -> str | None:
        return None if value is None else shipped_or_file(value)

    @model_validator(mode="after")
    def _one_source_of_peaks(self) -> "RooflineConfig":
        if self.peak_tflops is not None and self.profile is not None:
            raise _key_error("profile", self.profile, "give peak_tflops (one peak for every node) or "
                             "profile (a peak per data type), not both")
        if self.peak_tflops is None and self.profile is None:
            raise _key_error("peak_tflops", None, "required: give peak_tflops (one peak for every "
                             "node, TFLOP/s) or profile (a hardware profile's peak per data type)")
        if self.profile is None:
            for key, value in (("dtype", self.dtype), ("fp32_as_tf32", self.fp32_as_tf32 or None)):
                if value is not None:
                    raise _key_error(key, value, "only used with profile: peak_tflops is one peak "
                                     "for every data type")
        return self

    @model_serializer(mode="wrap")
    def _keys_in_effect(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The settings as the run uses them (the manifest echo in results.json): with peak_tflops,
        the keys of earlier releases only; with profile, the data type that nodes default to."""
        data: dict[str, Any] = handler(self)     # pydantic's serializer: the settings' JSON
        if self.profile is None:
            for key in ("profile", "dtype", "fp32_as_tf32"):
                data.pop(key, None)
        else:
            data.pop("peak_tflops", None)
            data["dtype"] = self.dtype or DEFAULT_DTYPE
        return data


class RooflineCompute(ComputeModel):
    name = "roofline"
    fidelity = ("roofline: num_ops / min(peak, bandwidth x num_ops/tensor_size), the peak one number "
                "or a hardware profile's for the node's data type; CPU ops and nodes without num_ops "
                "replay their traced duration")
    Config = RooflineConfig
    fold_safe = True
    # ASTRA-sim's roofline: a system file with roofline-enabled: 1 selects it, with these keys.
    astra_sim = AstraEquivalent("roofline", {"peak-perf": "peak_tflops", "local-mem-bw": "memory_bandwidth_gbps"})

    @classmethod
    def config_problems(cls, config: RooflineConfig, inputs: ValidationInputs) -> list[tuple[tuple[str | int, ...], str]]:
        """A profile file that cannot be read is a manifest problem (`chakra-sim validate` says so)."""
        if config.profile is None:
            return []
        return profile_problems(config.profile, inputs.base_dir)

    config: RooflineConfig

    def __init__(self, config: RooflineConfig, context: LayerContext) -> None:
        super().__init__(config, context)
        self.memory = context.memory
        self.profile: Profile | None = None
        self._peaks: dict[str, float] = {}       # FLOP/s per data type (profile only)
        self.dtype: str | None = None            # the default data type (profile only)
        self._fallen_back: set[str] = set()      # data types warned about
        self._unknown_attrs: set[str] = set()
        if config.profile is None:
            assert config.peak_tflops is not None       # the config's validator: one of the two is set
            self.peak = config.peak_tflops * 1e12        # FLOP/s, as ASTRA-sim scales peak-perf
        else:
            self._use_profile(config, context)
            assert self.dtype is not None                # _use_profile sets it
            self.peak = self._peaks[self.dtype]
        profile_bw = None if self.profile is None else self.profile.gpu.memory_bandwidth_gbps.value
        self._fixed_bw: float | None
        if config.memory_bandwidth_gbps is not None:
            self._fixed_bw = config.memory_bandwidth_gbps * 1e9
        elif self.memory is not None:
            self._fixed_bw = None
            if profile_bw is not None:
                self._note_memory_default(profile_bw)
        elif profile_bw:
            self._fixed_bw = profile_bw * 1e9
        else:
            raise SimulationError(
                "compute plugin 'roofline' needs a memory bandwidth: set compute.memory_bandwidth_gbps, "
                "select a memory layer (memory: {plugin: hbm, ...}) or time with a profile (its HBM "
                "bandwidth)")
        self.memory_bound = 0
        self.compute_bound = 0
        # with a profile: nodes timed per data type, indexed as PEAK_DTYPES (a list: the cheapest counter)
        self._by_dtype: list[int] | None = None if self.profile is None else [0] * len(PEAK_DTYPES)
        # folded runs: how many ranks each simulated rank stands for (counts are per rank)
        self._weights = context.inputs.rank_weights

    def _use_profile(self, config: RooflineConfig, context: LayerContext) -> None:
        # a profile that cannot be read was reported when the manifest was validated (config_problems)
        assert config.profile is not None                # called only with a profile
        profile = self.profile = load_profile(config.profile, context.base_dir)
        self._peaks = {dtype: sourced.value * 1e12 for dtype, sourced in profile.gpu.peak_tflops.items()
                       if sourced.value > 0}
        if config.fp32_as_tf32:
            if "tf32" not in self._peaks:
                raise SimulationError(f"compute.fp32_as_tf32: profile '{profile.name}' has no tf32 peak "
                                      f"(it has {', '.join(self._peaks)})")
            self._peaks["fp32"] = self._peaks["tf32"]
        dtype = config.dtype or DEFAULT_DTYPE
        self.dtype = "tf32" if config.fp32_as_tf32 and dtype == "fp32" else dtype
        if self.dtype not in self._peaks:
            where = "compute.dtype" if config.dtype else f"compute.dtype (default {DEFAULT_DTYPE})"
            raise SimulationError(f"{where}: profile '{profile.name}' has no {self.dtype} peak (it has "
                                  f"{', '.join(self._peaks)}); set compute.dtype to one of those")

    def _note_memory_default(self, profile_bw: float) -> None:
        """The memory layer's bandwidth wins over the profile's; say so when the memory layer only
        has its own default (its section sets no bandwidth_gbps) and the two differ."""
        assert self.memory is not None and self.profile is not None   # called only with both
        config: Any = getattr(self.memory, "config", None)
        fields = getattr(type(config), "model_fields", {})
        if "bandwidth_gbps" not in fields or "bandwidth_gbps" in config.model_fields_set:
            return
        layer_bw = self.memory.bandwidth_gbps(0)
        if layer_bw != profile_bw:
            self.context.warn(
                f"roofline: memory-bound nodes use the memory layer's default bandwidth ({layer_bw:g} GB/s), "
                f"not the HBM bandwidth of profile '{self.profile.name}' ({profile_bw:g} GB/s); set "
                f"memory.bandwidth_gbps (or compute.memory_bandwidth_gbps) to choose")

    def rate_ceiling_flops(self) -> float:
        """No node runs faster than the highest peak it may be timed at."""
        return max([self.peak, *self._peaks.values()])

    def bandwidth_bps(self, rank: int) -> float:
        """Bytes per second for `rank`: the configured value (or the profile's), else the memory layer's."""
        if self._fixed_bw is not None:
            return self._fixed_bw
        assert self.memory is not None                   # no fixed bandwidth: there is a memory layer
        return self.memory.bandwidth_gbps(rank) * 1e9

    def compute_time_ns(self, rank: int, node: NodeView) -> int | None:
        # the node's work (num_ops, intensity, peak) depends on the node alone: read it once per node
        # body; with a fixed bandwidth, so does the answer
        memo = node.memo
        if self._fixed_bw is None:
            work = memo.get(self)
            if work is None:
                work = memo[self] = self._work(node)
            # no fixed bandwidth: there is a memory layer (not narrowed at run time: a hot path)
            duration, bound, slot = self._roof(
                work, self.memory.bandwidth_gbps(rank) * 1e9)  # type: ignore[union-attr]  # memory is set
        else:
            cached = memo.get(self)
            if cached is None:
                cached = memo[self] = self._roof(self._work(node), self._fixed_bw)
            duration, bound, slot = cached
        if bound:
            weight = self._weights.get(rank, 1) if self._weights else 1
            if bound == _MEMORY:
                self.memory_bound += weight
            else:
                self.compute_bound += weight
            if slot is not None:
                self._by_dtype[slot] += weight  # type: ignore[index]  # a slot only with a profile: a list
        return duration

    def _work(self, node: NodeView) -> tuple[float | None, float | None, float, int | None]:
        """(num_ops or None to replay, intensity or None for no bytes, peak FLOP/s, index of the
        data type in PEAK_DTYPES or None without a profile)."""
        if node.is_cpu_op or not node.has("num_ops"):
            return None, None, 0.0, None
        num_ops = float(node.int("num_ops"))
        tensor_size = float(node.int("tensor_size", 0))
        if tensor_size == 0:
            return num_ops, None, 0.0, None
        if self.profile is None:
            return num_ops, num_ops / tensor_size, self.peak, None
        dtype, peak = self._peak_of(node)
        return num_ops, num_ops / tensor_size, peak, _SLOT[dtype]

    def _peak_of(self, node: NodeView) -> tuple[str, float]:
        """The data type a node is timed at and its peak in FLOP/s."""
        dtype, unknown_attr = node_dtype(node)
        if unknown_attr is not None and unknown_attr not in self._unknown_attrs:
            self._unknown_attrs.add(unknown_attr)
            self.context.warn(f"roofline: node {node.id} ({node.name!r}) has dtype attribute "
                              f"{unknown_attr!r}, not a data type with a peak ({', '.join(PEAK_DTYPES)}); "
                              "such nodes are timed by their input types, else compute.dtype")
        if dtype is None:
            return cast(str, self.dtype), self.peak      # set with a profile, the only case that gets here
        peak = self._peaks.get(dtype)
        if peak is None:
            if dtype not in self._fallen_back:
                self._fallen_back.add(dtype)
                assert self.profile is not None          # once per data type
                self.context.warn(f"roofline: profile '{self.profile.name}' has no {dtype} peak; {dtype} "
                                  f"nodes are timed at the {self.dtype} peak (compute.dtype)")
            return cast(str, self.dtype), self.peak
        if dtype == "fp32" and self.config.fp32_as_tf32:
            dtype = "tf32"
        return dtype, peak

    @staticmethod
    def _roof(work: tuple[float | None, float | None, float, int | None],
              bandwidth: float) -> tuple[int | None, int, int | None]:
        """(duration in ns or None to replay, which roof bounds it, data type slot)."""
        num_ops, intensity, peak, slot = work
        if num_ops is None:
            return None, _NONE, None
        if intensity is None:
            return 0, _NONE, None
        memory_perf = bandwidth * intensity
        if memory_perf < peak:
            bound, perf = _MEMORY, memory_perf
        else:
            bound, perf = _COMPUTE, peak
        if perf <= 0:
            return 0, bound, slot
        return int(num_ops / perf * 1e9), bound, slot

    def summary(self) -> JsonObject:
        out: JsonObject = {"memory_bound_nodes": self.memory_bound,
                               "compute_bound_nodes": self.compute_bound}
        if self._by_dtype is not None:   # with a profile: nodes timed (memory- or compute-bound) per type
            out["nodes_by_dtype"] = {dtype: count for dtype, count in zip(PEAK_DTYPES, self._by_dtype) if count}
        return out
