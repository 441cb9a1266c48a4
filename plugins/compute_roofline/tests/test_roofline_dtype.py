"""Peaks per data type from a hardware profile: how a node's data type is found, which peak and
bandwidth time it, the fallbacks and their warnings, config errors, and old configs unchanged."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from chakra_core import LayerContext, ManifestError, MemoryModel, NodeView, SimulationError, pb
from chakra_core.testing import EventQueue, comp, manifest, simulate, uniform_network, write_ranks
from chakra_core.hardware.profiles import BUILTIN_DIR, builtin_profiles, load_profile
from test_roofline import FakeMemory   # same folder (pytest puts it on sys.path)
from chakra_sim_compute_roofline import RooflineCompute, RooflineConfig
from chakra_core.et.dtypes import canonical, input_dtype, node_dtype

H100 = "h100-sxm-hgx"
PROFILE = load_profile(H100)
HBM_BPS = PROFILE.gpu.memory_bandwidth_gbps.value * 1e9
COMPUTE_BOUND = {"num_ops": 10**12, "tensor_size": 10**6}   # 10^6 FLOP/B: above any GPU's ridge point
MEMORY_BOUND = {"num_ops": 10**9, "tensor_size": 10**9}     # 1 FLOP/B: below any GPU's ridge point


@pytest.fixture(autouse=True)
def _needs_the_installed_plugin():
    from chakra_core.plugins import make_plugin_host

    try:
        make_plugin_host().get("compute", "roofline")
    except Exception as exc:  # not installed: simulate() could not select it
        pytest.skip(str(exc))


def node(node_id: int = 1, types: list[str] | str | None = None, shapes: list | str | None = None,
         work: dict | None = None, **attrs) -> pb.Node:
    """A GPU compute node with `work` (num_ops, tensor_size), input `types` / `shapes` written as the
    PyTorch converter writes them (Python-literal strings) and other attributes."""
    made = comp(node_id, 7, **(COMPUTE_BOUND if work is None else work), **attrs)
    if types is not None:
        made.inputs.types = types if isinstance(types, str) else repr(types)
    if shapes is not None:
        made.inputs.shapes = shapes if isinstance(shapes, str) else repr(shapes)
    return made


def view(**kwargs) -> NodeView:
    return NodeView(node(**kwargs))


def model(memory: MemoryModel | None = None, **config) -> RooflineCompute:
    context = LayerContext(num_ranks=2, scheduler=EventQueue(), memory=memory)
    return RooflineCompute(RooflineConfig(**({"profile": H100} | config)), context)


def at(peak_flops: float, num_ops: int = COMPUTE_BOUND["num_ops"]) -> int:
    """ns of `num_ops` at `peak_flops`, in the model's arithmetic."""
    return int(num_ops / peak_flops * 1e9)


def write_profile(folder, name: str, drop: tuple[str, ...] = ()) -> str:
    """A copy of the H100 profile without the peaks of `drop`, as `<folder>/<name>.yaml`."""
    data = yaml.safe_load((BUILTIN_DIR / f"{H100}.yaml").read_text())
    for dtype in drop:
        del data["gpu"]["peak_tflops"][dtype]
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path.name


# Compute- and memory-bound nodes of different data types --------------------------------------------
def test_compute_bound_times_follow_the_profiles_peaks():
    roofline = model()
    bf16 = roofline.compute_time_ns(0, view(node_id=1, dtype="bf16"))
    fp32 = roofline.compute_time_ns(0, view(node_id=2, dtype="fp32"))
    assert bf16 == at(PROFILE.peak_flops("bf16")) and fp32 == at(PROFILE.peak_flops("fp32"))
    assert fp32 / bf16 == pytest.approx(PROFILE.peak_flops("bf16") / PROFILE.peak_flops("fp32"), rel=1e-6)
    assert roofline.summary() == {"memory_bound_nodes": 0, "compute_bound_nodes": 2,
                                  "nodes_by_dtype": {"fp32": 1, "bf16": 1}}


@pytest.mark.parametrize("dtype", ["fp64", "fp32", "fp16", "bf16", "fp8", "int8"])
def test_memory_bound_nodes_ignore_the_data_type(dtype):
    roofline = model()
    # 10^9 FLOP at 3350 GB/s x 1 FLOP/B: the bandwidth roof, whatever the peak
    assert roofline.compute_time_ns(0, view(work=MEMORY_BOUND, dtype=dtype)) == int(1e9 / HBM_BPS * 1e9)
    assert roofline.summary() == {"memory_bound_nodes": 1, "compute_bound_nodes": 0,
                                  "nodes_by_dtype": {dtype: 1}}


def test_nodes_that_do_not_tell_use_the_configured_dtype():
    assert model().compute_time_ns(0, view()) == at(PROFILE.peak_flops("bf16"))        # default bf16
    roofline = model(dtype="fp16")
    assert roofline.compute_time_ns(0, view()) == at(PROFILE.peak_flops("fp16"))
    assert roofline.summary()["nodes_by_dtype"] == {"fp16": 1}


def test_replayed_and_empty_nodes_are_not_counted():
    roofline = model()
    assert roofline.compute_time_ns(0, view(is_cpu_op=True, dtype="fp32")) is None
    assert roofline.compute_time_ns(0, NodeView(comp(2, 7, dtype="fp32"))) is None           # no num_ops
    assert roofline.compute_time_ns(0, view(node_id=3, work={"num_ops": 10**6}, dtype="fp32")) == 0
    assert roofline.summary() == {"memory_bound_nodes": 0, "compute_bound_nodes": 0, "nodes_by_dtype": {}}


# How a node tells its data type -------------------------------------------------------------------
@pytest.mark.parametrize("written, dtype", [
    ("bf16", "bf16"), ("BFloat16", "bf16"), ("c10::BFloat16", "bf16"), ("torch.bfloat16", "bf16"),
    ("Tensor(c10::BFloat16)", "bf16"), ("float", "fp32"), ("float32", "fp32"), ("FP32", "fp32"),
    ("Tensor(float)", "fp32"), ("tf32", "tf32"), ("half", "fp16"), ("c10::Half", "fp16"),
    ("torch.float16", "fp16"), ("double", "fp64"), ("c10::Float8_e4m3fn", "fp8"), ("Float8_e5m2", "fp8"),
    ("torch.float8_e4m3fnuz", "fp8"), ("fp8", "fp8"), ("int8", "int8"), ("signed char", "int8"),
    (" bf16 ", "bf16")])
def test_dtype_attribute_spellings(written, dtype):
    assert canonical(written) == dtype
    roofline = model()
    assert roofline.compute_time_ns(0, view(dtype=written)) == at(roofline._peaks[dtype])
    assert roofline.summary()["nodes_by_dtype"] == {dtype: 1}


@pytest.mark.parametrize("written", ["long", "bool", "unsigned char", "c10::complex<float>", "fp9", ""])
def test_names_without_a_peak(written):
    assert canonical(written) is None


BF16, FP32, HALF, FP8, INT8, LONG = ("Tensor(c10::BFloat16)", "Tensor(float)", "Tensor(c10::Half)",
                                     "Tensor(c10::Float8_e4m3fn)", "Tensor(signed char)", "Tensor(long int)")


@pytest.mark.parametrize("types, shapes, dtype", [
    ([BF16, BF16, BF16], [[32, 2, 64], [192, 64], [192]], "bf16"),          # generated GEMM
    ([FP32, "Int", "Double"], [[8, 8], [], []], "fp32"),
    ([HALF], [[4, 4]], "fp16"),
    ([BF16, FP32, FP32, FP32, BF16], [[58304]] * 5, "fp32"),                 # Adam: a tie, the wider type
    ([FP8, FP8, FP32, FP32, "None", BF16], [[64, 64], [64, 64], [], [], [], [64]], "fp8"),  # _scaled_mm
    ([BF16, INT8, BF16], [[16, 4096], [4096, 4096], [4096]], "bf16"),        # weight-only int8 GEMM
    ([INT8, INT8], [[64, 64], [64, 64]], "int8"),                            # _int_mm
    ([BF16, LONG], [[50304, 1024], [8, 2048]], "bf16"),                      # embedding
    ([LONG, "Int"], [[8], []], None),                                        # nothing floating
    (["GenericList[Tensor(c10::Half),Tensor(c10::Half)]", FP32], [[[64, 64], [64, 64]], [4]], "fp16"),
    ([BF16, FP32], None, "fp32"),                                            # no shapes: the widest
    ([BF16, FP32], [[4]], "fp32"),                                           # shapes not matching: the widest
    ('["Tensor(c10::Half)"]', '[[4, 4]]', "fp16"),                           # JSON quoting
    ("Tensor(c10::Half) and then [ garbage", None, "fp16"),                  # not a literal: names alone
    ([], [], None),
])
def test_input_types(types, shapes, dtype):
    assert input_dtype(view(types=types, shapes=shapes)) == dtype


def test_inputs_decide_the_peak():
    roofline = model()
    assert roofline.compute_time_ns(0, view(node_id=1, types=[HALF, HALF], shapes=[[8, 8], [8, 8]])) == \
        at(PROFILE.peak_flops("fp16"))
    assert roofline.compute_time_ns(0, view(node_id=2, types=[FP32], shapes=[[8]])) == \
        at(PROFILE.peak_flops("fp32"))
    assert roofline.summary()["nodes_by_dtype"] == {"fp32": 1, "fp16": 1}


def test_the_attribute_wins_over_the_inputs():
    assert node_dtype(view(types=[BF16, BF16], dtype="fp8")) == ("fp8", None)
    roofline = model()
    assert roofline.compute_time_ns(0, view(types=[BF16, BF16], dtype="fp8")) == at(PROFILE.peak_flops("fp8"))


def test_an_unknown_attribute_warns_once_and_the_inputs_decide():
    roofline = model()
    for node_id in (1, 2):
        assert roofline.compute_time_ns(0, view(node_id=node_id, types=[FP32], dtype="fp9")) == \
            at(PROFILE.peak_flops("fp32"))
    assert len(roofline.context.warnings) == 1
    assert "'fp9'" in roofline.context.warnings[0] and "dtype attribute" in roofline.context.warnings[0]


def test_generated_transformer_nodes_carry_their_dtype():
    from chakra_core.jobs.expand import read_job
    from chakra_core.jobs.placement import Placement
    from chakra_core.jobs.program import RankProgram
    from chakra_core.tools.generate import transformer_job

    job = read_job(transformer_job(layers=1, hidden=64, heads=4, seq=32, batch=2, vocab=128, dtype="fp16"), "test")
    timed = [NodeView(n) for n in RankProgram(job, Placement(job, 8), 0).build() if n.type == pb.COMP_NODE
             and any(a.name == "num_ops" for a in n.attr)]
    found = {v.name: node_dtype(v)[0] for v in timed}
    assert found["mb0.L0.fc1"] == found["mb0.L0.qkv.wgrad"] == "fp16"
    assert found["optimizer.adam"] == "fp32"                      # fp32 Adam state
    assert {"fp16", "fp32"} <= set(found.values())


# fp32 on TF32 tensor cores ------------------------------------------------------------------------
def test_fp32_as_tf32():
    roofline = model(fp32_as_tf32=True)
    assert roofline.compute_time_ns(0, view(node_id=1, types=[FP32], shapes=[[8]])) == \
        at(PROFILE.peak_flops("tf32"))
    assert roofline.compute_time_ns(0, view(node_id=2, dtype="bf16")) == at(PROFILE.peak_flops("bf16"))
    assert roofline.summary()["nodes_by_dtype"] == {"tf32": 1, "bf16": 1}
    default_fp32 = model(fp32_as_tf32=True, dtype="fp32")
    assert default_fp32.compute_time_ns(0, view()) == at(PROFILE.peak_flops("tf32"))


def test_fp32_stays_fp32_by_default():
    assert model().compute_time_ns(0, view(types=[FP32], shapes=[[8]])) == at(PROFILE.peak_flops("fp32"))


# Data types the profile has no peak for ---------------------------------------------------------------
def test_a_dtype_without_a_peak_falls_back_and_warns_once(tmp_path):
    name = write_profile(tmp_path, "gpu-without-fp8", drop=("fp8",))
    ranks = [[node(1, dtype="fp8"), node(2, types=[FP8, FP8], shapes=[[4, 4], [4, 4]])],
             [node(1, dtype="fp8"), node(2, dtype="fp16")]]
    prefix = write_ranks(tmp_path, ranks)
    results = simulate(manifest(prefix, uniform_network(2), compute={"plugin": "roofline", "profile": name}),
                       base_dir=tmp_path)
    warnings = [w for w in results["warnings"] if "fp8" in w]
    assert len(warnings) == 1
    assert "gpu-without-fp8" in warnings[0] and "no fp8 peak" in warnings[0] and "bf16" in warnings[0]
    bf16, fp16 = at(PROFILE.peak_flops("bf16")), at(PROFILE.peak_flops("fp16"))
    assert results["ranks"][0]["compute_ns"] == 2 * bf16
    assert results["ranks"][1]["compute_ns"] == bf16 + fp16
    assert results["layers"]["compute"]["summary"]["nodes_by_dtype"] == {"fp16": 1, "bf16": 3}


def test_a_profile_without_the_configured_dtype_is_an_error(tmp_path):
    name = write_profile(tmp_path, "gpu-without-bf16", drop=("bf16",))
    with pytest.raises(SimulationError, match=r"compute\.dtype \(default bf16\).*no bf16 peak"):
        model(profile=str(tmp_path / name))
    assert model(profile=str(tmp_path / name), dtype="fp16").dtype == "fp16"


def test_fp32_as_tf32_needs_a_tf32_peak(tmp_path):
    name = write_profile(tmp_path, "gpu-without-tf32", drop=("tf32",))
    with pytest.raises(SimulationError, match="fp32_as_tf32.*no tf32 peak"):
        model(profile=str(tmp_path / name), fp32_as_tf32=True)


@pytest.mark.parametrize("name", builtin_profiles())
def test_every_shipped_profile_times_every_dtype_it_has(name):
    profile = load_profile(name)
    default = "bf16" if "bf16" in profile.gpu.peak_tflops else next(iter(profile.gpu.peak_tflops))
    roofline = model(profile=name, dtype=default)
    for node_id, dtype in enumerate(profile.gpu.peak_tflops, start=1):
        if profile.gpu.peak_tflops[dtype].value > 0:
            assert roofline.compute_time_ns(0, view(node_id=node_id, dtype=dtype)) == \
                at(profile.peak_flops(dtype))


# Memory bandwidth: explicit key > memory layer > profile ---------------------------------------------
def test_the_profile_gives_the_bandwidth_without_key_or_memory_layer():
    assert model().bandwidth_bps(0) == HBM_BPS


def test_the_memory_layer_wins_over_the_profile():
    roofline = model(memory=FakeMemory([1000.0, 500.0]))
    # 10^9 B at 1000 GB/s (rank 0), 500 GB/s (rank 1)
    assert roofline.compute_time_ns(0, view(work=MEMORY_BOUND, dtype="fp32")) == 1_000_000
    assert roofline.compute_time_ns(1, view(work=MEMORY_BOUND, dtype="fp32")) == 2_000_000
    assert roofline.context.warnings == []     # FakeMemory has no bandwidth_gbps key left at a default


def test_the_key_wins_over_the_memory_layer_and_the_profile():
    roofline = model(memory=FakeMemory([1000.0, 1000.0]), memory_bandwidth_gbps=4000.0)
    assert roofline.compute_time_ns(0, view(work=MEMORY_BOUND)) == 250_000


def test_a_memory_layer_at_its_default_bandwidth_is_used_with_a_warning():
    hbm = pytest.importorskip("chakra_sim_memory_hbm")
    context = LayerContext(num_ranks=1, scheduler=EventQueue())
    default = hbm.HBMMemory(hbm.HBMConfig(), context)
    roofline = model(memory=default)
    assert roofline.bandwidth_bps(0) == hbm.HBMConfig().bandwidth_gbps * 1e9
    assert len(roofline.context.warnings) == 1 and H100 in roofline.context.warnings[0]
    chosen = hbm.HBMMemory(hbm.HBMConfig(bandwidth_gbps=1234.0), context)
    roofline = model(memory=chosen)
    assert roofline.bandwidth_bps(0) == 1234e9 and roofline.context.warnings == []


def test_memo_holds_the_per_node_answer():
    roofline = model(memory=FakeMemory([1000.0, 500.0]))
    shared = view(types=[HALF], shapes=[[8]])
    roofline.compute_time_ns(0, shared)
    shared.pb.inputs.types = repr([FP32])        # not read again: the node's work is memoised
    assert roofline.compute_time_ns(1, shared) == at(PROFILE.peak_flops("fp16"))
    assert roofline.summary()["nodes_by_dtype"] == {"fp16": 2}


# Config errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize("data, key, words", [
    ({"peak_tflops": 100, "profile": H100}, "profile", ("peak_tflops", "profile", "not both")),
    ({}, "peak_tflops", ("peak_tflops", "profile")),
    ({"memory_bandwidth_gbps": 1000}, "peak_tflops", ("peak_tflops", "profile")),
    ({"peak_tflops": 100, "dtype": "bf16"}, "dtype", ("profile",)),
    ({"peak_tflops": 100, "fp32_as_tf32": True}, "fp32_as_tf32", ("profile",)),
    ({"profile": "no-such-gpu"}, "profile", ("no-such-gpu", H100)),
    ({"profile": H100, "dtype": "fp9"}, "dtype", ("bf16",)),
])
def test_config_errors_name_the_key(data, key, words):
    with pytest.raises(ValidationError) as info:
        RooflineConfig.model_validate(data)
    errors = info.value.errors()
    assert [e["loc"] for e in errors] == [(key,)]
    for word in words:
        assert word in errors[0]["msg"]


def test_the_manifest_reports_both_sources_at_the_key(tmp_path):
    prefix = write_ranks(tmp_path, [[node(1)]])
    data = manifest(prefix, uniform_network(1),
                    compute={"plugin": "roofline", "peak_tflops": 100, "profile": H100})
    with pytest.raises(ManifestError, match=r"compute\.profile: give peak_tflops .* or profile .*not both"):
        simulate(data, base_dir=tmp_path)


def test_a_missing_profile_file_names_the_key(tmp_path):
    prefix = write_ranks(tmp_path, [[node(1)]])
    data = manifest(prefix, uniform_network(1), compute={"plugin": "roofline", "profile": "mine.yaml"})
    # found when the manifest is validated (chakra-sim validate reports it too), not mid-run
    with pytest.raises(ManifestError, match=r"compute\.profile: .*mine\.yaml: profile file not found"):
        simulate(data, base_dir=tmp_path)


def test_a_profile_file_relative_to_the_manifest(tmp_path):
    name = write_profile(tmp_path, "my-gpu")
    prefix = write_ranks(tmp_path / "traces", [[node(1, dtype="fp16")]])
    results = simulate(manifest(prefix, uniform_network(1), compute={"plugin": "roofline", "profile": name}),
                       base_dir=tmp_path)
    assert results["ranks"][0]["compute_ns"] == at(PROFILE.peak_flops("fp16"))


# Old configs: one peak, results as before ----------------------------------------------------------
def test_peak_tflops_configs_ignore_data_types_and_match_the_hand_computation(tmp_path):
    """peak 100 TFLOP/s, 1000 GB/s: the node's dtype attribute and input types change nothing."""
    kinds = [{}, {"dtype": "fp8"}, {"types": [FP32], "shapes": [[8]]}, {"types": [HALF], "dtype": "fp64"}]
    works = [COMPUTE_BOUND, MEMORY_BOUND, {"num_ops": 30 * 10**9, "tensor_size": 16 << 20}]
    ranks = [[node(i + 1, work=work, **kind) for i, work in enumerate(works)] for kind in kinds]
    prefix = write_ranks(tmp_path, ranks)
    compute = {"plugin": "roofline", "peak_tflops": 100, "memory_bandwidth_gbps": 1000}
    results = simulate(manifest(prefix, uniform_network(len(kinds)), compute=compute), base_dir=tmp_path)
    # 10^12 FLOP at 100 TFLOP/s = 10 ms; 10^9 B at 1000 GB/s = 1 ms; 3e10 FLOP at 100 TFLOP/s = 300 us
    expected = 10_000_000 + 1_000_000 + 300_000
    assert [rank["compute_ns"] for rank in results["ranks"]] == [expected] * len(kinds)
    assert results["layers"]["compute"]["summary"] == {"memory_bound_nodes": 4, "compute_bound_nodes": 8}
    assert not any("roofline" in w for w in results["warnings"])


def test_peak_tflops_with_a_memory_layer_is_unchanged():
    roofline = RooflineCompute(RooflineConfig(peak_tflops=100.0), LayerContext(
        num_ranks=2, scheduler=EventQueue(), memory=FakeMemory([1000.0, 250.0])))
    shared = view(work=MEMORY_BOUND, dtype="fp8")
    assert roofline.compute_time_ns(0, shared) == 1_000_000
    assert roofline.compute_time_ns(1, shared) == 4_000_000
    assert roofline.summary() == {"memory_bound_nodes": 2, "compute_bound_nodes": 0}


def test_the_manifest_echo_holds_the_keys_in_effect(tmp_path):
    """results.json echoes the settings: as before for peak_tflops, with the default dtype for a profile."""
    prefix = write_ranks(tmp_path, [[node(1)]])
    compute = {"plugin": "roofline", "peak_tflops": 100, "memory_bandwidth_gbps": 1000}
    old = simulate(manifest(prefix, uniform_network(1), compute=compute), base_dir=tmp_path)
    assert old["manifest"]["compute"] == {"plugin": "roofline", "peak_tflops": 100.0,
                                          "memory_bandwidth_gbps": 1000.0}
    new = simulate(manifest(prefix, uniform_network(1), compute={"plugin": "roofline", "profile": H100}),
                   base_dir=tmp_path)
    assert new["manifest"]["compute"] == {"plugin": "roofline", "profile": H100, "dtype": "bf16",
                                          "fp32_as_tf32": False, "memory_bandwidth_gbps": None}
    assert RooflineConfig.model_validate(RooflineConfig(profile=H100).model_dump()).dtype == "bf16"
