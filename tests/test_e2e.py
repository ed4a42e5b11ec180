"""`fp8bench e2e` on the CPU: cases and identity, the kernel classifier, conversion through the backend
registry, the run loop (fp8bench.harness.runner) on a tiny model with a fake clock, resuming a run and
re-running a case from its identity. The GPU measurement is marked `gpu`."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import sys

from unittest import mock

import pandas as pd
import pytest
import torch
from torch import nn

if not torch.cuda.is_available():  # our kernels on the CPU, before any kernel module is imported
    os.environ["TRITON_INTERPRET"] = "1"

from fp8bench.backends import convert  # noqa: E402
from fp8bench.benchmarks import e2e  # noqa: E402
from fp8bench.config import Status, TimingConfig  # noqa: E402
from fp8bench.harness.case import Unsupported  # noqa: E402
from fp8bench.harness.results import CASE_KEY, ID_COLUMNS, RunWriter, load_results, read_rows  # noqa: E402
from fp8bench.harness.runner import rerun, resume, run_cases  # noqa: E402
from fp8bench.harness.timing import KernelRecord  # noqa: E402
from fp8bench.nn.float8_linear import Float8Linear  # noqa: E402
from fp8bench.nn.llama import PRESETS, Llama, LlamaConfig, loss_fn  # noqa: E402
from fp8bench.nn.recipes import RECIPES  # noqa: E402
from compiled_graphs import saved_by_compiled_block  # noqa: E402

TINY = LlamaConfig("tiny", dim=64, ffn_dim=128, heads=4, kv_heads=2, vocab=256, layers=2)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@pytest.fixture(autouse=True)
def without_transformer_engine(monkeypatch):
    """The CPU tests describe a machine without TransformerEngine (its rows `unsupported`): on a GPU host that has
    it, its import is made to fail as a missing package's does."""
    for name in ("transformer_engine", "transformer_engine.pytorch"):
        monkeypatch.setitem(sys.modules, name, None)

# Kernel names recorded from torch.profiler traces of LLaMa training steps on an H100 (BF16 and FP8, eager,
# compiled and FSDP2), with the class each belongs to.
RECORDED_KERNELS = {
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT": "gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas": "gemm",
    "_gemm_persistent_kernel": "gemm",
    "triton_tem_fused_mm_0": "gemm",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, true, false, false, false, true, true, false>(pytorch_flash::Flash_fwd_params)": "attention",
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t>>(pytorch_flash::Flash_bwd_params)": "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0": "attention",
    "fmha_cutlassF_bf16_aligned_64x128_rf_sm80": "attention",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<c10::BFloat16, 4, (at::native::ADAM_MODE)1, false>>": "optimizer",
    "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "comm",
    "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "comm",
    "void at::native::(anonymous namespace)::chunk_cat_cuda_kernel<float, float>": "comm",
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": "norm_act",
    "triton_poi_fused_mul_silu_1": "norm_act",
    "triton_red_fused__to_copy_abs_amax_clamp_mean_mul_pow_rsqrt_2": "norm_act",
    "_quantize_tensorwise_kernel": "cast",
    "void transformer_engine::detail::cast_transpose_kernel<8, true, __nv_bfloat16, __nv_fp8_e4m3>": "cast",
    "triton_red_fused_abs_amax_0": "cast",
    # inductor's fused kernels are named after the ops they fuse and read: fp8_gemm's output here, no product
    "triton_red_fused__to_copy_abs_amax_cat_clamp_fp8_gemm_gt_mul_reciprocal_scalar_tensor_silu_silu_backward_split_transpose_fp8_view_where_3": "norm_act",
    "triton_red_fused__to_copy_abs_amax_clamp_fp8_gemm_gt_mul_reciprocal_scalar_tensor_transpose_fp8_view_where_1": "cast",
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>": "other",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>": "other",
}


@pytest.mark.parametrize("name, expected", RECORDED_KERNELS.items())
def test_kernel_classes_of_recorded_kernel_names(name, expected):
    assert e2e.kernel_class(name) == expected


def _config(**kwargs) -> e2e.E2EConfig:
    defaults = dict(model=TINY, recipes=(RECIPES["tensorwise"],), seq_len=32, batch=2, steps=3, warmup=1, compile="none")
    return e2e.E2EConfig(**{**defaults, **kwargs})


def test_cases_put_each_groups_bf16_reference_first_and_name_their_identity():
    config = _config(model=PRESETS["llama3-8b"].with_layers(4), seq_len=8192, batch=1, compile="block",
                     recipes=(RECIPES["tensorwise"], RECIPES["blockwise"]))  # fmt: skip
    cases = config.cases()
    assert [(c.implementation, c.recipe_name, c.compile) for c in cases[:3]] == [("bf16", "bf16", "none"), ("bf16", "bf16", "block"),
                                                                                   ("te-layer", "bf16", "block")]  # fmt: skip
    assert {(c.implementation, c.recipe_name) for c in cases[3:]} == {
        (impl, recipe) for impl in ("triton", "torchao", "te", "te-layer") for recipe in ("tensorwise", "blockwise")
    }
    assert cases[2].identity["granularity"] == "none" and not cases[2].is_reference
    identity = cases[3].identity
    assert set(identity) == set(ID_COLUMNS) - {"options"}
    assert identity["case"] == "llama3-8b.L4.S8192.B1"
    assert (identity["M"], identity["K"], identity["world_size"], identity["compile"]) == (8192, 4096, "1", "block")
    assert cases[3].group == cases[2].group == cases[1].group != cases[0].group
    assert cases[3].work.tokens == 8192
    assert cases[3].work.flops == PRESETS["llama3-8b"].with_layers(4).flops_per_token(8192) * 8192


def test_case_from_identity_round_trips_presets_and_custom_models():
    bench = e2e.E2EBenchmark(device="cpu")
    custom = e2e.custom_model(512, 1536, 8, 2, 32000, 3)
    for model in (PRESETS["llama3-70b"].with_layers(2), custom):
        case = e2e.E2ECase(model, 4096, 2, 2, "model", "selective", "torchao", RECIPES["rowwise"], "fp8")
        assert bench.case_from_identity(case.identity) == case
    te_layer_bf16 = e2e.E2ECase(custom, 4096, 2, 1, "block", "none", "te-layer", None)
    assert bench.case_from_identity(te_layer_bf16.identity) == te_layer_bf16
    # The run's settings outside the identity come from the benchmark: a gate re-runs a case as its run ran it.
    blocks_kept = e2e.E2EBenchmark(device="cpu", attention="cudnn", reshard_after_forward="never")
    sharded = e2e.E2ECase(custom, 4096, 2, 2, "block", "selective", "triton", RECIPES["tensorwise"], attention="cudnn", reshard_after_forward="never")
    assert blocks_kept.case_from_identity(sharded.identity) == sharded
    assert sharded.options["reshard_after_forward"] == "never"
    with pytest.raises(ValueError, match="not an e2e case name"):
        bench.case_from_identity({**case.identity, "case": "4096x4096x4096"})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(compile="blocks"), "unknown compile mode 'blocks'"),
        (dict(checkpointing="some"), "unknown activation checkpointing"),
        (dict(lm_head="fp16"), "unknown LM head precision"),
        (dict(implementations=("tri",)), "unknown FP8 implementation 'tri'"),
        (dict(steps=1), "at least 2 measured steps"),
        (dict(attention="sdpa"), "unknown attention backend 'sdpa'"),
        (dict(reshard_after_forward="always"), "unknown reshard-after-forward policy 'always'; choose one of: default, never"),
    ],
)
def test_config_validates_once(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _config(**kwargs)


def test_a_bf16_case_has_a_bf16_lm_head_and_only_te_layer_of_the_fp8_implementations_runs_without_a_recipe():
    with pytest.raises(ValueError, match="a BF16 model has a BF16 LM head"):
        e2e.E2ECase(TINY, 32, 2, 1, "none", "none", "te-layer", None, "fp8")
    with pytest.raises(ValueError, match="torchao is an FP8 implementation: it needs a recipe"):
        e2e.E2ECase(TINY, 32, 2, 1, "none", "none", "torchao", None)


def test_the_attention_backend_is_pinned_for_the_step_and_recorded_in_the_rows():
    def enabled():
        return (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())

    before = enabled()
    with e2e.attention_context("math"):
        assert enabled() == (False, False, True)
    with e2e.attention_context("flash"):
        assert enabled() == (True, False, False)
    with e2e.attention_context("auto"):
        assert enabled() == before
    assert enabled() == before
    assert _config().cases()[0].options["attention"] == "flash"  # the default
    assert {case.options["attention"] for case in _config(attention="math").cases()} == {"math"}


def test_synthetic_tokens_are_seeded_and_targets_are_the_next_tokens():
    a = next(e2e.SyntheticTokens(256, 2, 16, 7, "cpu"))
    b = next(e2e.SyntheticTokens(256, 2, 16, 7, "cpu"))
    torch.testing.assert_close(a, b)
    tokens, targets = a
    assert tokens.shape == targets.shape == (2, 16)
    torch.testing.assert_close(tokens[:, 1:], targets[:, :-1])
    # Zipf: the most frequent token is token 0, far above uniform.
    many = next(e2e.SyntheticTokens(256, 4, 1024, 0, "cpu"))[0]
    assert (many == 0).float().mean() > 5 / 256


def test_loss_problem_catches_divergence_and_non_finite_losses():
    assert e2e.loss_problem(5.0, 5.01) is None
    assert e2e.loss_problem(6.0, 5.0) == "mean loss 6.0000 vs BF16's 5.0000 (> 10% above)"
    assert e2e.loss_problem(4.0, 5.0) is None  # below BF16's: no divergence
    assert e2e.loss_problem(math.nan, 5.0) == "mean loss nan"


def test_our_conversion_keeps_the_lm_head_in_bf16_unless_asked():
    model = Llama(TINY)
    converted = convert(model, "triton", RECIPES["tensorwise"])
    assert isinstance(model.layers[0].attention.wqkv, Float8Linear) and type(model.output) is nn.Linear
    assert converted.options["converted_linears"] == 4 * TINY.layers
    head = Llama(TINY)
    convert(head, "triton", RECIPES["tensorwise"], lm_head_fp8=True)
    assert isinstance(head.output, Float8Linear)


@pytest.mark.parametrize(
    "implementation, recipe, message",
    [("torchao", "blockwise", "torchao"), ("te", "rowwise", "TransformerEngine has no rowwise"), ("te", "tensorwise", "transformer_engine"),
     ("te-layer", "rowwise", "TransformerEngine has no rowwise"), ("te-layer", "tensorwise", "transformer_engine")],  # fmt: skip
)
def test_conversions_a_library_cannot_do_are_unsupported(implementation, recipe, message):
    with pytest.raises(Unsupported, match=message):
        convert(Llama(TINY), implementation, RECIPES[recipe])


def late_ms(index: int) -> int:
    """How late FakeClock's profiled step `index` starts its cast, ms."""
    return 5 if index == 0 else 3 * (index % 2 == 0)


class FakeClock:
    """Runs each step for real (the model trains) and reports made-up, fixed times."""

    name = "fake"

    def __init__(self):
        self.calls = 0

    def _call(self, fn, count):
        for _ in range(count):
            fn()
            self.calls += 1

    def run(self, fn, calls):
        self._call(fn, calls)

    def samples(self, fn, count):
        self._call(fn, count)
        return [10.0 + i for i in range(count)]

    def wall_ms(self, fn, count):
        self._call(fn, count)
        return 12.0

    def kernel_records(self, fn, count):
        """Per step: on the compute stream (7) a GEMM [0, 6) ms, attention [7, 9), a cast and an elementwise
        kernel; on NCCL's (20) an all-gather [5.5, 7.5): 1 ms idle, all of it exposed communication. The first
        step's cast starts 5 ms late (a queue the host was still filling), so does every other later step's by
        3 ms (`late_ms`), and step i's elementwise kernel lasts i / 4 ms: the breakdown averages the steps after
        the first."""
        self._call(fn, count)
        ms = 1_000_000  # ns

        def step(index: int) -> list[KernelRecord]:
            late = late_ms(index)
            return [
                KernelRecord("nvjet_tst_128x256", 0, 6 * ms, 7), KernelRecord("ncclDevKernel_AllGather_RING_LL", 11 * ms // 2, 2 * ms, 20),
                KernelRecord("pytorch_flash::flash_fwd_kernel", 7 * ms, 2 * ms, 7),
                KernelRecord("_quantize_tensorwise_kernel", (9 + late) * ms, ms // 2, 7),
                KernelRecord("elementwise", (19 + 2 * late) * ms // 2, index * ms // 4, 7),
            ]  # fmt: skip

        return [step(index) for index in range(count)]

    def sm_clock_mhz(self):
        return None


def _benchmark(config: e2e.E2EConfig, clock, run_dir=None) -> e2e.E2EBenchmark:
    return e2e.E2EBenchmark("cpu", clock=clock, run_dir=run_dir, steps=config.steps, warmup=config.warmup, load_te="te" in config.implementations)


def _run(config: e2e.E2EConfig, clock, run_dir, cases=None):
    benchmark = _benchmark(config, clock, run_dir)
    with RunWriter(run_dir, {}, resume=cases is not None) as writer:
        return run_cases(benchmark, config.cases() if cases is None else cases, writer, None, TimingConfig())


def test_run_writes_a_row_per_case_with_throughput_loss_and_breakdown(tmp_path, monkeypatch):
    torch.manual_seed(0)
    monkeypatch.setattr(e2e, "LR_WARMUP_STEPS", 1)  # the full rate from the first step: the tiny model learns in 10
    config = _config(implementations=("te",))
    clock = FakeClock()
    rows = _run(config, clock, tmp_path)
    frame = load_results(tmp_path)
    assert list(frame["backend"]) == ["bf16", "te"]
    bf16, te = frame.iloc[0], frame.iloc[1]
    assert bf16["status"] == Status.OK.value and te["status"].startswith("unsupported: transformer_engine")
    assert clock.calls == config.warmup + config.steps + e2e.WALL_STEPS + e2e.PROFILED_STEPS
    assert bf16["median_ms"] == 11.0 and bf16["repeats"] == 3
    assert bf16["tokens_per_s"] == pytest.approx(64 / 0.011, rel=1e-5)  # the CSV keeps 6 digits
    assert bf16["tflops"] == pytest.approx(TINY.flops_per_token(32) * 64 / 0.011 / 1e12, rel=1e-5)
    averaged = range(1, e2e.PROFILED_STEPS)  # the first profiled step is left out
    assert len(averaged) >= 2
    assert (bf16["gemm_ms"], bf16["attention_ms"], bf16["cast_ms"], bf16["comm_ms"]) == (6.0, 2.0, 0.5, 2.0)
    assert bf16["other_ms"] == pytest.approx(statistics.fmean(index / 4 for index in averaged))
    assert bf16["compute_idle_ms"] == pytest.approx(1 + statistics.fmean(late_ms(index) for index in averaged))
    assert bf16["exposed_comm_ms"] == pytest.approx(1.0)
    # Trained on Zipf tokens, the loss has fallen below the uniform loss ln(vocab) within a few steps.
    assert 0 < bf16["final_loss"] < math.log(TINY.vocab) and 0 < bf16["mean_loss"] < math.log(TINY.vocab)
    assert (tmp_path / e2e.KERNELS_CSV).exists()
    assert "tok/s/GPU" in e2e.row_line(rows[0])


def test_a_traced_run_writes_a_chrome_trace_of_one_more_step_per_case(tmp_path):
    """--trace: after each case's profiled steps, one more step under torch.profiler, written per case and rank
    as a gzip-compressed Chrome trace holding the step's host ops (here, on the CPU, its products)."""
    import gzip
    import json

    config = _config(implementations=())
    benchmark = dataclasses.replace(_benchmark(config, FakeClock(), tmp_path), trace_dir=tmp_path / e2e.TRACES)
    with RunWriter(tmp_path, {}) as writer:
        rows = run_cases(benchmark, config.cases(), writer, None, TimingConfig())
    assert [row.values["status"] for row in rows] == [Status.OK.value]
    (case,) = config.cases()
    (path,) = (tmp_path / e2e.TRACES).iterdir()
    assert path.name == f"{e2e.trace_name(case)}.rank0.json.gz" == "tiny.L2.S32.B2.bf16.bf16.compile-none.ac-none.head-bf16.ws1.rank0.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    assert any(event.get("name") == "aten::mm" for event in events)


def test_the_e2e_command_passes_trace_to_its_config():
    from typer.testing import CliRunner

    from fp8bench.cli import app

    with mock.patch.object(e2e, "run_command") as run_command, mock.patch("fp8bench.cli.require_cuda", lambda command: "NVIDIA H100 80GB HBM3"):
        result = CliRunner().invoke(app, ["e2e", "--trace", "--implementation", "bf16", "--out", "runs/x"])
    assert result.exit_code == 0, result.output
    assert run_command.call_args.args[0].trace is True


def test_without_transformer_engine_te_layer_gives_unsupported_rows_in_bf16_and_fp8(tmp_path):
    config = _config(implementations=("te-layer",), recipes=(RECIPES["tensorwise"], RECIPES["rowwise"]))
    _run(config, FakeClock(), tmp_path)
    frame = load_results(tmp_path)
    assert list(zip(frame["backend"], frame["recipe"], frame["status"])) == [
        ("bf16", "bf16", Status.OK.value),
        ("te-layer", "bf16", "unsupported: transformer_engine is not installed"),
        ("te-layer", "tensorwise", "unsupported: transformer_engine is not installed"),
        ("te-layer", "rowwise", "unsupported: TransformerEngine has no rowwise recipe on Hopper (ours maps tensorwise-delayed, tensorwise, blockwise)"),
    ]


class Diverging:
    """A case of the reference's group (BF16 training, named as ours) whose losses come out tenfold."""

    def __init__(self, case: e2e.E2ECase):
        self.case, self.is_reference = case, False
        self.identity = {**case.identity, "backend": "triton", "recipe": "tensorwise"}

    def __getattr__(self, name):
        return getattr(self.case, name)

    def build(self, inputs):
        built = self.case.build(inputs)
        check = built.check

        def diverged():
            columns = check()
            return {**columns, "final_loss": 10 * columns["final_loss"], "mean_loss": 10 * columns["mean_loss"]}

        built.check = diverged
        return built


def test_a_diverging_fp8_run_is_a_wrong_result(tmp_path):
    # BF16's run as the reference, then a case of its group with a loss far from it.
    config = _config(implementations=())
    reference = config.cases()[0]
    rows = _run(config, FakeClock(), tmp_path, [reference, Diverging(reference)])
    assert rows[0].values["status"] == Status.OK.value
    assert rows[1].values["status"].startswith("failed: wrong result: mean loss")
    for loss in ("final_loss", "mean_loss"):
        assert rows[1].values[loss] == pytest.approx(10 * rows[0].values[loss], rel=0.1)
    assert rows[1].values.get("median_ms") is None  # a wrong result's time measures nothing
    kernels = pd.read_csv(tmp_path / e2e.KERNELS_CSV)
    assert set(kernels["backend"]) == {"bf16"}  # the wrong result's kernels are not recorded


# A custom model: its case name gives the model back (case_from_identity), as a re-run needs.
CUSTOM = e2e.custom_model(64, 128, 4, 2, 256, 2)


def test_a_resumed_run_measures_the_groups_left_and_keeps_the_finished_ones(tmp_path):
    first, second = _config(model=CUSTOM, implementations=("te",)), _config(model=CUSTOM, implementations=("te",), seq_len=16)
    _run(first, FakeClock(), tmp_path)  # the run stopped after the first group
    cases = first.cases() + second.cases()
    left = resume(cases, tmp_path)
    assert left == second.cases()
    clock = FakeClock()
    benchmark = _benchmark(first, clock, tmp_path)
    benchmark.resume_kernels()
    with RunWriter(tmp_path, {}, resume=True) as writer:
        run_cases(benchmark, left, writer, None, TimingConfig())
    assert clock.calls == first.warmup + first.steps + e2e.WALL_STEPS + e2e.PROFILED_STEPS  # the second group's BF16 only
    frame = load_results(tmp_path)
    assert [(row.M, row.backend) for row in frame.itertuples()] == [(64, "bf16"), (64, "te"), (32, "bf16"), (32, "te")]
    kernels = pd.read_csv(tmp_path / e2e.KERNELS_CSV)
    assert list(kernels.groupby("case", sort=False).size().index) == [f"{CUSTOM.name}.L2.S32.B2", f"{CUSTOM.name}.L2.S16.B2"]


def test_resuming_on_several_gpus_keeps_the_one_gpu_baseline_rows_and_kernels(tmp_path):
    """--one-gpu-baseline: the one-GPU run, then the same cases on two GPUs resuming its folder. The second
    run measures all of its cases and keeps the first's rows and kernels: the report's scaling table has both.
    (Here the two-GPU cases find one process and are `unsupported` rows.)"""
    one, two = _config(model=CUSTOM, implementations=("te",)), _config(model=CUSTOM, implementations=("te",), world_size=2)
    _run(one, FakeClock(), tmp_path)
    left = resume(two.cases(), tmp_path, two.kept_on_resume)
    assert left == two.cases()
    benchmark = _benchmark(two, FakeClock(), tmp_path)
    benchmark.resume_kernels()
    with RunWriter(tmp_path, {}, resume=True) as writer:
        run_cases(benchmark, left, writer, None, TimingConfig())
    frame = load_results(tmp_path)
    assert [(str(row.world_size), row.backend, row.status) for row in frame.itertuples()] == [
        ("1", "bf16", "ok"), ("1", "te", frame.status.iloc[1]),
        ("2", "bf16", "unsupported: the case trains on 2 ranks; this run has 1"),
        ("2", "te", "unsupported: the case trains on 2 ranks; this run has 1"),
    ]
    kernels = pd.read_csv(tmp_path / e2e.KERNELS_CSV, dtype={"world_size": str})
    assert set(kernels["world_size"]) == {"1"} and "bf16" in set(kernels["backend"])
    # Resuming the one-GPU run in turn keeps the two-GPU rows; without the rule they would go.
    assert resume(one.cases(), tmp_path, one.kept_on_resume) == [] and len(load_results(tmp_path)) == 4
    assert resume(one.cases(), tmp_path) == [] and len(load_results(tmp_path)) == 2


def test_kernels_written_before_they_named_their_world_size_resume_as_this_runs(tmp_path):
    config = _config(model=CUSTOM, implementations=("te",))
    _run(config, FakeClock(), tmp_path)
    kernels = pd.read_csv(tmp_path / e2e.KERNELS_CSV)
    kernels.drop(columns="world_size").to_csv(tmp_path / e2e.KERNELS_CSV, index=False)
    benchmark = _benchmark(config, FakeClock(), tmp_path)
    benchmark.resume_kernels()
    assert len(benchmark.kernel_records) == len(kernels) and {r["world_size"] for r in benchmark.kernel_records} == {"1"}


def test_the_gate_reruns_a_flagged_e2e_case_from_its_identity_beside_its_reference(tmp_path):
    config = _config(model=CUSTOM, implementations=("torchao", "te"))
    _run(config, FakeClock(), tmp_path / "run")
    flagged = next(row for row in read_rows(tmp_path / "run") if row["backend"] == "te")  # as the CSV spells it
    clock = FakeClock()
    with RunWriter(tmp_path / "rerun", {}) as writer:
        rows = rerun([flagged], writer, {"e2e": _benchmark(config, clock, tmp_path / "rerun")}, None, TimingConfig())
    assert [(r.values["backend"], r.values["recipe"]) for r in rows] == [("bf16", "bf16"), ("te", "tensorwise")]
    assert rows[0].values["status"] == Status.OK.value and rows[0].values["final_loss"] > 0
    assert rows[1].values["status"].startswith("unsupported: transformer_engine")
    assert clock.calls == config.warmup + config.steps + e2e.WALL_STEPS + e2e.PROFILED_STEPS  # the reference alone trained
    rerun_ids = load_results(tmp_path / "rerun")[list(CASE_KEY)].astype(str).values.tolist()
    run_ids = load_results(tmp_path / "run")[list(CASE_KEY)].astype(str).values.tolist()
    assert all(identity in run_ids for identity in rerun_ids)


def test_a_case_for_more_ranks_than_the_run_has_is_unsupported():
    case = e2e.E2ECase(TINY, 32, 2, 2, "none", "none", "bf16", None)
    with pytest.raises(Unsupported, match="trains on 2 ranks; this run has 1"):
        case.build(e2e.E2EInputs("cpu"))


@pytest.mark.gpu
def test_e2e_on_the_gpu_measures_bf16_and_ours(tmp_path):
    config = _config(model=PRESETS["llama3-8b"].with_layers(1), seq_len=2048, batch=1, steps=3, warmup=2,
                     implementations=("triton",), compile="block")  # fmt: skip
    from fp8bench.model.hardware import spec_for_device_name

    benchmark = e2e.gpu_benchmark(config, tmp_path, torch.cuda.get_device_name())
    with RunWriter(tmp_path, {}) as writer:
        rows = run_cases(benchmark, config.cases(), writer, None, TimingConfig())
    assert benchmark.spec == spec_for_device_name(torch.cuda.get_device_name())
    statuses = [r.values["status"] for r in rows]
    assert statuses == ["ok"] * 3, statuses
    ours = rows[2].values
    assert ours["speedup_vs_bf16"] > 0.5 and ours["gemm_ms"] > 0 and ours["mem_alloc_gb"] > 0


@pytest.mark.parametrize("checkpointing", ["selective", "selective-casts", "full"])
def test_activation_checkpointing_recomputes_the_same_step(checkpointing):
    """Checkpointed blocks train to the same loss as stored activations, on the same tokens."""
    losses = []
    for mode in ("none", checkpointing):
        case = e2e.E2ECase(TINY, 32, 2, 1, "none", mode, "bf16", None)
        built = case.build(e2e.E2EInputs("cpu"))
        for _ in range(3):
            built.run()
        losses.append(built.check()["final_loss"])
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    model = Llama(TINY)
    e2e.apply_checkpointing(model, checkpointing)
    assert all(type(block).__name__ == "CheckpointWrapper" for block in model.layers)


@pytest.mark.parametrize("checkpointing", ["selective", "selective-casts", "full"])
def test_checkpointed_delayed_scaling_recomputes_with_the_forwards_scales(checkpointing):
    """Ours with delayed scaling, checkpointed: the recompute casts with the forward's scales and records no
    amax again, so the losses and every amax history equal those without checkpointing (before, the first
    step's recompute took another cast path than its forward, and torch's checkpoint raised)."""
    runs = []
    for mode in ("none", checkpointing):
        model = Llama(TINY, dtype=torch.bfloat16)
        model.init_weights(e2e.SEED)
        converted = convert(model, "triton", RECIPES["tensorwise-delayed"])
        e2e.apply_checkpointing(model, mode, converted)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        tokens = torch.randint(0, TINY.vocab, (2, 33), generator=torch.Generator().manual_seed(0))
        losses = []
        for _ in range(3):
            loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            converted.after_optimizer_step()
            losses.append(loss.item())
        histories = {name.replace("_checkpoint_wrapped_module.", ""): buffer.clone()
                     for name, buffer in model.named_buffers() if "amax_history" in name}  # fmt: skip
        runs.append((losses, histories))
    (losses, histories), (checkpointed_losses, checkpointed_histories) = runs
    assert checkpointed_losses == losses
    assert histories and checkpointed_histories.keys() == histories.keys()
    for name, history in histories.items():
        assert int((history > 0).sum()) == 3 or "grad_output" in name or "weight" in name, (name, history[:4])
        torch.testing.assert_close(checkpointed_histories[name], history, rtol=0, atol=0, msg=name)


def test_compiled_checkpointed_blocks_with_delayed_scaling_are_one_graph_each():
    """Compiled under selective checkpointing, ours' delayed scaling traces each block whole: whether the
    histories are filled is set after the optimizer step, not in the block's forward, where it was a side
    effect torch.compile cannot trace inside a checkpoint (the blocks ran uncompiled: 1.25 s a step against
    0.63 s for dynamic scaling, full 8B on 4 x H200)."""
    from torch._dynamo.utils import counters

    case = e2e.E2ECase(TINY, 32, 2, 1, "block", "selective", "triton", RECIPES["tensorwise-delayed"])
    built = case.build(e2e.E2EInputs("cpu"))
    for _ in range(3):
        built.run()
    assert math.isfinite(built.check()["final_loss"])
    assert counters["stats"]["unique_graphs"] >= 1
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.parametrize("implementation", ["bf16", "triton"])
def test_full_checkpointing_under_compile_saves_no_activation_of_the_block(implementation):
    """Compiled, a fully checkpointed block saves only its inputs and the attention's RNG state: no output of
    our FP8 linears' autograd.Function either (torch 2.11's plain checkpoint left those untagged, and the
    partitioner saved every FP8 cast and product of the block)."""
    saved = saved_by_compiled_block(implementation, "full")
    assert [dtype for _, dtype in saved] == [torch.uint8], saved  # the RNG state
    assert "run_and_save_rng_state" in saved[0][0]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_selective_checkpointing_under_compile_saves_products_and_amaxes_not_casts(recipe):
    """Selective: our products' outputs are saved, none of the FP8 casts (recomputed in the backward); under
    rowwise scaling the feed-forward's products too, inside its one autograd function (Float8FeedForward).
    Tensorwise, the amaxes the casts scale by are saved (torchtitan's policy keeps max): the recompute does
    not read each tensor for its amax again."""
    saved = saved_by_compiled_block("triton", "selective", recipe=recipe)
    assert any("fp8_gemm" in op for op, _ in saved), saved
    assert not any(dtype in FP8 for _, dtype in saved), saved
    assert any(op == "aten.max.default" for op, _ in saved) == (recipe == "tensorwise"), saved


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise"])
def test_selective_casts_checkpointing_under_compile_saves_the_fp8_casts_the_backward_reads(recipe):
    """selective-casts: the products' outputs and the FP8 copies the backward products read (of the inputs and
    the weights, with their scales) are saved, so that no cast runs again in the backward."""
    saved = saved_by_compiled_block("triton", "selective-casts", recipe=recipe)
    casts = [op for op, dtype in saved if dtype in FP8]
    assert any("fp8_gemm" in op for op, _ in saved), saved
    assert len(casts) >= 8 and all(op.startswith("fp8bench.") and "quantize" in op for op in casts), saved  # two a linear


def test_selective_casts_keeps_torchaos_casts_into_fp8_too():
    """torchao casts with torch ops: a copy into an FP8 dtype, or a clone of FP8 data (its transposed copy)."""
    bf16, fp8 = torch.ones(2, dtype=torch.bfloat16), torch.ones(2).to(torch.float8_e4m3fn)
    aten = torch.ops.aten
    for keep_casts in (False, True):
        assert e2e._saved_by_selective(aten._to_copy.default, (bf16,), {"dtype": torch.float8_e4m3fn}, keep_casts) is keep_casts
        assert e2e._saved_by_selective(aten.clone.default, (fp8,), {}, keep_casts) is keep_casts
        assert e2e._saved_by_selective(aten._to_copy.default, (bf16,), {"dtype": torch.float32}, keep_casts) is False
        assert e2e._saved_by_selective(aten.max.default, (bf16,), {}, keep_casts) is True


def test_learning_rate_warms_up_linearly_then_holds():
    factors = [e2e.warmup_factor(step) for step in range(e2e.LR_WARMUP_STEPS + 5)]
    assert factors[0] == pytest.approx(1 / e2e.LR_WARMUP_STEPS)
    assert factors[e2e.LR_WARMUP_STEPS - 1] == factors[-1] == 1.0
    assert all(b > a for a, b in zip(factors, factors[1:e2e.LR_WARMUP_STEPS]))


def test_fp8_gemm_time_relative_to_bf16_per_recipe():
    rates = e2e.GemmRates(500.0, {"tensorwise/on": 1000.0, "tensorwise/off": 800.0, "axiswise/off": 625.0}, 900.0, "test")
    # Forward with fast accumulation, both backward products without.
    assert rates.relative_time(RECIPES["tensorwise"]) == pytest.approx((0.5 + 0.625 + 0.625) / 3)
    # grad_weight kept in BF16; grad_input axiswise (its weight tensorwise, broadcast); no axiswise/on: off's rate.
    assert rates.relative_time(RECIPES["rowwise_with_gw_hp"]) == pytest.approx((0.8 + 0.8 + 1.0) / 3)
    # Blockwise was not measured: the fallback.
    assert rates.relative_time(RECIPES["blockwise"]) == pytest.approx(500 / 900)


def test_ideal_speedup_runs_the_converted_share_of_the_bf16_gemm_time_at_the_fp8_rate():
    rates = e2e.GemmRates(500.0, {}, 1000.0, "test")  # FP8 twice as fast everywhere
    case = e2e.E2ECase(TINY, 32, 2, 1, "block", "none", "triton", RECIPES["tensorwise"])
    linears = TINY.layers * TINY.block_linear_parameters()
    share = linears / (linears + TINY.vocab * TINY.dim)  # the LM head stays BF16
    assert e2e.ideal_speedup(case, 100.0, 60.0, rates) == pytest.approx(100 / (100 - 60 * share * 0.5))
    head = e2e.E2ECase(TINY, 32, 2, 1, "block", "none", "triton", RECIPES["tensorwise"], "fp8")
    assert e2e.ideal_speedup(head, 100.0, 60.0, rates) == pytest.approx(100 / 70)


def test_gemm_rates_come_from_the_calibration_profile_where_there_is_one():
    from fp8bench.model.hardware import GPUS

    calibrated = e2e.GemmRates.of_gpu(GPUS["h100-sxm"])  # calibration/h100-sxm.json is committed
    assert calibrated.source.startswith("calibrated") and calibrated.bf16_tflops < GPUS["h100-sxm"].bf16_tflops
    peaks = e2e.GemmRates.of_gpu(GPUS["h100-pcie"])
    assert (peaks.bf16_tflops, peaks.fp8_fallback_tflops) == (GPUS["h100-pcie"].bf16_tflops, GPUS["h100-pcie"].fp8_tflops)


def test_cast_time_is_the_layer_rooflines_casts_of_every_converted_linear():
    """Ours compiled, tensorwise: per linear of K -> N on M tokens, the input's and grad_output's amax are fused
    into their producers and one cast+transpose kernel each reads bf16 and writes both fp8 copies (2 + 2
    bytes an element); the weight takes an amax pass and a cast+transpose (2 + 2 + 2). At 1 TB/s and a
    negligible launch floor that is bytes / 1e12 s."""
    rates = e2e.GemmRates(500.0, {}, 1000.0, "test", mem_tbps=1.0, launch_us=1e-9)
    case = e2e.E2ECase(TINY, 32, 2, 1, "block", "none", "triton", RECIPES["tensorwise"])
    m = case.tokens
    kv = TINY.kv_heads * TINY.head_dim
    linears = [(TINY.dim, TINY.dim + 2 * kv), (TINY.dim, TINY.dim), (TINY.dim, 2 * TINY.ffn_dim), (TINY.ffn_dim, TINY.dim)]
    expected_bytes = TINY.layers * sum(4 * m * k + 6 * k * n + 4 * m * n for k, n in linears)
    assert e2e.cast_ms(case, rates) == pytest.approx(expected_bytes / 1e12 * 1e3)
    # Eager, the activations' amax is a pass of its own: 2 more bytes an element of input and grad_output.
    eager = e2e.E2ECase(TINY, 32, 2, 1, "none", "none", "triton", RECIPES["tensorwise"])
    more = TINY.layers * sum(2 * m * k + 2 * m * n for k, n in linears)
    assert e2e.cast_ms(eager, rates) == pytest.approx((expected_bytes + more) / 1e12 * 1e3)
    assert e2e.cast_ms(case, e2e.GemmRates(500.0, {}, 1000.0, "no bandwidth")) is None


RECORDED_RUN = "tests/data/e2e-h100-trial/results.csv"


@pytest.mark.parametrize("recipe", ["tensorwise", "tensorwise-delayed", "rowwise", "rowwise_with_gw_hp", "blockwise"])
def test_the_prediction_on_a_recorded_bf16_step_lies_between_bf16_and_the_ideal(recipe):
    """On the BF16 compiled step of a recorded H100 run (4 blocks of 8B, seq 8192) and the committed H100
    calibration: ideal step < predicted step = ideal step + the casts < BF16 step, for ours and each reference
    offering the recipe, the prediction being what the run loop writes into the row (against_reference)."""
    from fp8bench.model.hardware import GPUS

    frame = pd.read_csv(RECORDED_RUN)
    bf16 = frame[(frame["backend"] == "bf16") & (frame["compile"] == "block")].iloc[0]
    spec = GPUS["h100-sxm"]
    rates = e2e.GemmRates.of_gpu(spec)
    bench = e2e.E2EBenchmark("cpu", spec=spec, rates=rates)
    config = e2e.parse_case_name(bf16["case"])[0]
    for implementation in ("triton", "torchao", "te"):
        case = e2e.E2ECase(config, 8192, 1, 1, "block", "none", implementation, RECIPES[recipe])
        ideal_ms = bf16["median_ms"] / e2e.ideal_speedup(case, bf16["median_ms"], bf16["gemm_ms"], rates)
        predicted_ms = e2e.predicted_step_ms(case, bf16["median_ms"], bf16["gemm_ms"], rates)
        casts = e2e.cast_ms(case, rates)
        if casts is None:  # a library without the recipe
            assert implementation != "triton" and predicted_ms is None
            continue
        assert predicted_ms == pytest.approx(ideal_ms + casts)
        assert 0.5 < casts < bf16["median_ms"] - ideal_ms, (implementation, casts)  # casts cost, and FP8 still gains
        reference = {"mean_loss": 1.0, "median_ms": bf16["median_ms"], "gemm_ms": bf16["gemm_ms"]}
        columns = bench.against_reference(case, {"mean_loss": 1.0, "tflops": 600.0}, reference)
        assert columns["predicted_speedup"] == pytest.approx(bf16["median_ms"] / predicted_ms)
        assert 1.0 < columns["predicted_speedup"] < columns["ideal_speedup"]


def test_the_loss_is_compiled_whenever_the_model_is():
    """torchtitan's practice: eager, the loss's float32 logits are a copy of their own, read and written again
    in the backward, the same in every row."""
    assert e2e.training_loss("none") is loss_fn
    for mode in ("block", "model"):
        compiled = e2e.training_loss(mode)
        assert compiled is not loss_fn and compiled._torchdynamo_orig_callable is loss_fn
