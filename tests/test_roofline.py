"""The roofline model, its recipes, calibration profiles and the `roofline` / `calibrate` commands.

CPU tests check the model against hand computations, against torchao's published table, and for the
properties any sound model has; the GPU test runs the calibration itself.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import pandas as pd
import pytest
from scipy import stats
from typer.testing import CliRunner

from fp8bench.benchmarks import roofline as predicted
from fp8bench.model import roofline as rl
from fp8bench.benchmarks import shapes
from fp8bench.model import calibration
from fp8bench.model.calibration import CalibrationProfile, load_profile, save_profile
from fp8bench.cli import app
from fp8bench.config import FastAccum, GemmShape, Granularity
from fp8bench.model.hardware import GPUS
from fp8bench.nn.recipes import (
    RECIPE_CHOICES,
    RECIPES,
    CastConfig,
    GemmRole,
    LinearTensors,
    Recipe,
    ScalingType,
    TensorRole,
    get_recipe,
    layer_shape_problem,
    linear_gemm_shapes,
)
from fp8bench.harness.results import load_results

H100 = GPUS["h100-sxm"]
SPEC = rl.spec_ceilings(H100)
SQUARE = shapes.square()
TRITON = rl.IMPLEMENTATIONS["triton"]


def _supported(recipe):
    return [impl for impl in rl.IMPLEMENTATIONS.values() if impl.unsupported_reason(recipe) is None]


def _profile(**changes) -> CalibrationProfile:
    values = dict(
        gpu_key="h100-sxm",
        gpu_name="NVIDIA H100 80GB HBM3",
        bf16_tflops=700.0,
        fp8_tflops={"tensorwise/on": 1300.0, "axiswise/on": 1310.0},
        copy_tbps=3.0,
        launch_us=2.5,
        measured_utc="2025-01-01T00:00:00+00:00",
        shapes=("8192x8192x8192",),
        environment={"versions": {"torch": "2.x"}},
    )
    values.update(changes)
    return CalibrationProfile(**values)


# ---- the public model -----------------------------------------------------------------------------


def test_public_model_matches_a_hand_computation():
    """torchao's model at 4096^3, tensorwise, with torchao's H100 constants, worked out by hand."""
    ceilings = rl.uniform_fp8(rl.spec_ceilings(rl.TORCHAO_H100))
    s, n = 4096, 4096 * 4096
    bw, launch = 2.4e12 * 0.92, 2e-6
    bf16_gemm = 2 * s**3 / (989e12 * 0.78)  # compute-bound: 6n bytes take far less
    fp8_gemm = 2 * s**3 / (1979e12 * 0.78)
    activation = 2 * launch + 4 * n / bw  # fused amax (two launch floors) + cast writing both layouts
    weight = 2 * n / bw + launch + 2 * (3 * n / bw)  # amax, second stage, forward and backward casts
    expected = 3 * bf16_gemm / (3 * fp8_gemm + 2 * activation + weight)
    prediction = rl.predict_public(GemmShape(s, s, s), RECIPES["tensorwise"], ceilings)
    assert prediction.speedup == pytest.approx(expected, rel=1e-9)
    assert prediction.bf16_s == pytest.approx(3 * bf16_gemm, rel=1e-9)


# torchao's published LayerNorm -> Linear -> sigmoid speedups (tensorwise, measured on their H100,
# /work/shared/seeds/001: fp8_dyn_sp) for M = K = N = 256 ... 32768.
PUBLISHED_TENSORWISE = (0.465634, 0.489556, 0.734123, 0.815678, 1.236320, 1.432213, 1.803456, 1.696376)


def test_public_model_follows_torchaos_published_trend():
    ceilings = rl.uniform_fp8(rl.spec_ceilings(rl.TORCHAO_H100))
    predicted = [rl.predict_public(shape, RECIPES["tensorwise"], ceilings).speedup for shape in SQUARE]
    assert [s.M for s in SQUARE] == [2**i for i in range(8, 16)]
    rho = stats.spearmanr(predicted, PUBLISHED_TENSORWISE).statistic
    assert rho > 0.9
    # Past the launch-bound sizes the measured speedup lands near the roofline, not above it by much.
    for shape, model, measured in zip(SQUARE, predicted, PUBLISHED_TENSORWISE):
        if shape.M >= 2048:
            assert 0.75 < measured / model < 1.1, (shape.name, measured, model)
        # Both cross 1x between 2048 and 4096 (the model at 2048 is just under 1 with these constants).
        assert (model > 1.0) == (shape.M >= 4096)


def test_public_model_defines_only_torchaos_recipes():
    shape = GemmShape(4096, 4096, 4096)
    for name, recipe in RECIPES.items():
        prediction = rl.predict_public(shape, recipe, rl.uniform_fp8(SPEC))
        assert (prediction is None) == (name not in rl.PUBLIC_CAST_BYTES)


# ---- the refined model ----------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", RECIPES.values(), ids=lambda r: r.name)
def test_refined_model_is_monotone_in_size(recipe):
    for impl in _supported(recipe):
        predictions = [rl.predict(shape, recipe, impl, SPEC) for shape in SQUARE]
        for smaller, larger in zip(predictions, predictions[1:]):
            assert smaller.bf16_s <= larger.bf16_s
            assert smaller.fp8_s <= larger.fp8_s
            assert smaller.speedup <= larger.speedup + 1e-12, (impl.name, smaller.shape.name)


@pytest.mark.parametrize("recipe", RECIPES.values(), ids=lambda r: r.name)
def test_fp8_gemms_beat_bf16_at_large_sizes_and_the_layer_gains_less(recipe):
    for shape in SQUARE[4:]:  # 4096 and up
        for impl in _supported(recipe):
            p = rl.predict(shape, recipe, impl, SPEC)
            fp8_gemm, bf16_gemm = p.term_s("gemm"), p.term_s("gemm", fp8=False)
            assert fp8_gemm < bf16_gemm
            # Casts cost time and LayerNorm/sigmoid gain nothing: the layer gains less than its GEMMs.
            assert 1.0 < p.speedup < bf16_gemm / fp8_gemm
            assert p.term_s("cast") > 0
            assert p.term_s("layernorm") + p.term_s("sigmoid") > 0


def test_grad_weight_in_bf16_costs_gemm_time():
    shape = GemmShape(16384, 16384, 16384)
    full = rl.predict(shape, RECIPES["rowwise"], TRITON, SPEC)
    hp = rl.predict(shape, RECIPES["rowwise_with_gw_hp"], TRITON, SPEC)
    assert hp.term_s("gemm:grad_weight") > full.term_s("gemm:grad_weight")
    assert hp.term_s("gemm:output") == full.term_s("gemm:output")
    assert hp.term_s("gemm") > full.term_s("gemm")
    # ...and saves cast work: two FP8 forms fewer.
    assert hp.term_s("cast") < full.term_s("cast")


def test_finer_granularities_run_slower_gemms():
    shape = GemmShape(8192, 8192, 8192)
    gemm = {name: rl.predict(shape, RECIPES[name], TRITON, SPEC).term_s("gemm") for name in ("tensorwise", "rowwise", "blockwise")}
    assert gemm["tensorwise"] <= gemm["rowwise"] < gemm["blockwise"]


def test_delayed_scaling_skips_the_amax_pass():
    shape = GemmShape(8192, 8192, 8192)
    for impl in (TRITON, rl.IMPLEMENTATIONS["te"], rl.IMPLEMENTATIONS["unfused"]):
        dynamic = rl.predict(shape, RECIPES["tensorwise"], impl, SPEC)
        delayed = rl.predict(shape, RECIPES["tensorwise-delayed"], impl, SPEC)
        assert delayed.term_s("cast") < dynamic.term_s("cast"), impl.name
        assert not any("amax pass" in k.kernel.name for k in delayed.fp8)


def test_compiled_triton_fuses_the_activations_tensor_amax_and_delayed_casts():
    """Our compiled layer differs from eager where inductor fuses into LayerNorm or sigmoid backward:
    tensorwise loses the amax passes over input and grad_output; tensorwise-delayed's sigmoid backward
    writes grad_output in FP8 (1 byte an element, not 2) and our transpose reads that, not BF16 (2 bytes
    saved an element), as our LayerNorm already does for the input, eager too (Float8LayerNormLinear):
    nothing else changes (the weight has no producer; rowwise scales come from their rows)."""
    shape = GemmShape(8192, 4096, 2048)
    compiled = rl.IMPLEMENTATIONS["triton-compile"]
    for name, recipe in RECIPES.items():
        eager, fused = rl.layer_kernels(shape, recipe, TRITON), rl.layer_kernels(shape, recipe, compiled)
        saved = sum(k.bytes for k in eager) - sum(k.bytes for k in fused)
        name = name.removesuffix("-hybrid")  # e5m2 gradients fuse as their e4m3 preset's
        if name == "tensorwise":
            assert saved == (shape.M * shape.K + shape.M * shape.N) * rl.BF16_BYTES
            assert [k.name for k in fused if "amax pass" in k.name] == ["weight: amax pass (read once)"]
            assert rl.predict(shape, recipe, compiled, SPEC).speedup > rl.predict(shape, recipe, TRITON, SPEC).speedup
        elif name == "tensorwise-delayed":
            assert saved == 3 * shape.M * shape.N * rl.FP8_BYTES
            assert [k.name for k in fused if k.term.startswith("cast") and k.bytes] == [
                "input: transpose fp8", "weight: cast + transpose to fp8", "grad_output: transpose fp8"
            ]
        else:
            assert fused == eager, name


def _cast_bytes(shape, recipe_name, impl_name, role=None):
    kernels = rl.layer_kernels(shape, RECIPES[recipe_name], rl.IMPLEMENTATIONS[impl_name])
    prefix = f"cast:{role.value}" if role else "cast"
    return sum(k.bytes for k in kernels if k.term.startswith(prefix))


def test_fused_cast_transpose_moves_fewer_bytes_than_unfused_casts():
    shape = GemmShape(8192, 8192, 8192)
    for name in RECIPES:
        assert _cast_bytes(shape, name, "triton") <= _cast_bytes(shape, name, "unfused"), name
    # Column scales from an amax pass instead of a BF16 transpose: the rowwise saving in particular.
    assert _cast_bytes(shape, "rowwise", "triton") < 0.8 * _cast_bytes(shape, "rowwise", "unfused")


@pytest.mark.parametrize("recipe_name", sorted(rl.PUBLIC_CAST_BYTES))
def test_torchao_weight_casts_are_torchaos_own_count(recipe_name):
    """The weight has no producer to fuse with, so the refined plan must equal torchao's count."""
    shape = GemmShape(4096, 2048, 1024)
    public = sum(rl.PUBLIC_CAST_BYTES[recipe_name][TensorRole.WEIGHT]) * shape.K * shape.N
    assert _cast_bytes(shape, recipe_name, "torchao", TensorRole.WEIGHT) == public


def test_te_layernorm_writes_the_fp8_input_under_delayed_scaling():
    shape = GemmShape(8192, 4096, 4096)
    te = rl.IMPLEMENTATIONS["te"]

    def layernorm_forward(kernels):
        return next(k for k in kernels if k.name == "layernorm forward")

    bf16 = layernorm_forward(rl.layer_kernels(shape, None))
    delayed = layernorm_forward(rl.layer_kernels(shape, RECIPES["tensorwise-delayed"], te))
    dynamic = layernorm_forward(rl.layer_kernels(shape, RECIPES["tensorwise"], te))
    assert delayed.bytes_written == pytest.approx(bf16.bytes_written - shape.M * shape.K)  # 1 byte, not 2
    assert dynamic.bytes_written == bf16.bytes_written  # the scale is not known before LayerNorm runs


def test_bounds_are_launch_when_tiny_and_compute_when_large():
    tiny = rl.predict(SQUARE[0], RECIPES["tensorwise"], TRITON, SPEC)
    assert {t.bound for t in tiny.fp8} == {rl.Bound.LAUNCH}
    large = rl.predict(SQUARE[-1], RECIPES["tensorwise"], TRITON, SPEC)
    assert all(t.bound is rl.Bound.COMPUTE for t in large.fp8 if t.kernel.term.startswith("gemm"))
    assert all(t.bound is rl.Bound.MEMORY for t in large.fp8 if not t.kernel.term.startswith("gemm"))
    assert rl.Prediction.bound_of(large.fp8) is rl.Bound.COMPUTE


@pytest.mark.parametrize("gpu", GPUS.values(), ids=lambda g: g.key)
def test_predictions_for_every_gpu_in_the_table(gpu):
    ceilings = rl.spec_ceilings(gpu)
    for shape in (GemmShape(8192, 4096, 14336), GemmShape(16384, 8192, 1280)):
        for recipe in RECIPES.values():
            for impl in _supported(recipe):
                p = rl.predict(shape, recipe, impl, ceilings)
                assert math.isfinite(p.speedup) and p.speedup > 0
    # More bandwidth, same compute: the memory-bound casts shrink, so FP8 gains more on an H200.
    if gpu.key == "h200":
        shape = GemmShape(4096, 4096, 4096)
        h100 = rl.predict(shape, RECIPES["tensorwise"], TRITON, SPEC)
        assert rl.predict(shape, RECIPES["tensorwise"], TRITON, ceilings).speedup > h100.speedup


def test_unsupported_recipes_name_the_reason():
    reason = rl.IMPLEMENTATIONS["te"].unsupported_reason(RECIPES["rowwise"])
    assert "te has no rowwise recipe" in reason
    assert all(rl.IMPLEMENTATIONS["triton"].unsupported_reason(r) is None for r in RECIPES.values())


# ---- recipes --------------------------------------------------------------------------------------


def test_recipe_per_argument_defaults_and_gemm_kernels():
    tensorwise = RECIPES["tensorwise"]
    assert tensorwise.input_for_grad_weight == tensorwise.input
    assert tensorwise.gemms.output.use_fast_accum
    assert not tensorwise.gemms.grad_weight.use_fast_accum
    hp = RECIPES["rowwise_with_gw_hp"]
    assert hp.gemm_granularity(GemmRole.GRAD_INPUT) is Granularity.AXISWISE  # axiswise x tensorwise
    assert hp.gemm_granularity(GemmRole.GRAD_WEIGHT) is Granularity.NONE
    assert RECIPES["blockwise"].weight.transpose_invariant and not RECIPES["blockwise"].input.transpose_invariant


def test_the_three_products_of_a_linear_by_name():
    """out[M, N] = x[M, K] @ w.T: grad_input = grad_output[M, N] @ w[N, K], grad_weight = grad_output.T[N, M] @ x[M, K]."""
    products = linear_gemm_shapes(GemmShape(8192, 4096, 1024))
    assert (products.output.M, products.output.K, products.output.N) == (8192, 4096, 1024)
    assert (products.grad_input.M, products.grad_input.K, products.grad_input.N) == (8192, 1024, 4096)
    assert (products.grad_weight.M, products.grad_weight.K, products.grad_weight.N) == (1024, 8192, 4096)
    assert [gemm for gemm, _ in products.items()] == list(GemmRole)
    assert all(products[gemm] is getattr(products, gemm.value) for gemm in GemmRole)
    assert LinearTensors.build(lambda role: role.value) == LinearTensors("input", "weight", "grad_output")
    # K = 8200 is a multiple of 8 but not of 16: the output and grad_weight products reduce over it.
    assert layer_shape_problem(GemmShape(4096, 8200, 4096), RECIPES["tensorwise"]).startswith("the output product (4096x8200x4096)")
    assert layer_shape_problem(GemmShape(4096, 4096, 4096), RECIPES["blockwise"]) is None


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Recipe("mixed", input_for_grad_weight=CastConfig.original_precision()), "mixes FP8 and original"),
        (lambda: CastConfig(ScalingType.DELAYED, Granularity.AXISWISE), "tensorwise only"),
        (lambda: CastConfig(granularity=Granularity.BLOCKWISE), "needs a block"),
        (lambda: CastConfig(granularity=Granularity.BLOCKWISE, block=(2, 128)), "1x128 or 128x128"),
        (lambda: CastConfig(granularity=Granularity.NONE), "needs a granularity"),
        (lambda: get_recipe("fp4"), "choose one of: tensorwise, tensorwise-delayed"),
    ],
)
def test_bad_recipes_are_refused_with_a_reason(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# ---- calibration profiles -------------------------------------------------------------------------


def test_calibration_profile_round_trip(tmp_path):
    profile = _profile()
    path = save_profile(profile, tmp_path / "sub" / "h100-sxm.json")
    assert load_profile(path) == profile
    assert json.loads(path.read_text())["fp8_tflops"]["tensorwise/on"] == 1300.0


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not JSON"),
        ("[]", "does not hold a profile"),
        (json.dumps({"format": 99}), "format"),
        (json.dumps({**_profile().to_json(), "copy_tbps": -1}), "copy_tbps must be a positive number"),
        (json.dumps({**_profile().to_json(), "fp8_tflops": {"axiswise/on": 1.0}}), "tensorwise/on"),
        (json.dumps({k: v for k, v in _profile().to_json().items() if k != "launch_us"}), "lacks launch_us"),
    ],
)
def test_bad_calibration_files_are_refused_with_a_reason(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_profile(path)


def test_calibrated_ceilings_fill_gaps_from_tensorwise_and_say_so():
    ceilings = rl.calibrated_ceilings(_profile())
    assert ceilings.gemm_tflops(Granularity.AXISWISE, True) == 1310.0  # measured
    expected = 1300.0 * rl.FP8_GEMM_RELATIVE[(Granularity.BLOCKWISE, FastAccum.OFF)]
    assert ceilings.gemm_tflops(Granularity.BLOCKWISE, False) == pytest.approx(expected)
    scaled = ceilings.label.rsplit("; ", 1)[-1]
    assert scaled.endswith(" scaled from tensorwise/on") and "blockwise/off" in scaled and "axiswise/on" not in scaled
    assert ceilings.gemm_tflops(Granularity.NONE, False) == 700.0


# ---- the commands ---------------------------------------------------------------------------------


@pytest.fixture
def calibration_dir(tmp_path, monkeypatch):
    """An empty calibration folder in place of the installed checkout's, and tmp_path as the current folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path / "calibration")
    return tmp_path / "calibration"


def _roofline(tmp_path, *args):
    return CliRunner().invoke(app, ["roofline", "--no-measure", "--out", str(tmp_path / "run"), *args])


def test_roofline_cli_writes_predictions_not_measurements(tmp_path, calibration_dir):
    result = _roofline(tmp_path, "--gpu", "h100-sxm", "--shape-gen", "custom", "--M", "8192", "--K", "4096", "--N", "4096")
    assert result.exit_code == 0, result.output
    rows = load_results(tmp_path / "run")
    assert set(rows["benchmark"]) == {"roofline"} and set(rows["backend"]) == {"model"}
    assert rows["median_ms"].isna().all() and rows["tflops"].isna().all() and (rows["timer"] == "").all()
    ok = rows[rows["status"] == "ok"]
    assert (ok["predicted_ms"] > 0).all() and set(ok["bound"]) <= {"compute", "memory", "launch"}
    # bf16 per model; per recipe the public model where defined; per recipe and implementation the refined one.
    recipes = RECIPE_CHOICES["all"]  # the default: the e4m3 presets
    expected = 2 + len(rl.PUBLIC_CAST_BYTES) + len(recipes) * len(rl.IMPLEMENTATIONS)
    assert len(rows) == expected
    unsupported = rows[rows["status"].str.startswith("unsupported")]
    assert set(unsupported["recipe"]) == {"tensorwise-delayed", "blockwise", "rowwise", "rowwise_with_gw_hp"}
    refined = ok[ok["options"].map(lambda o: json.loads(o)["model"]) == "refined"].dropna(subset=["predicted_speedup"])
    assert len(refined) == len(recipes) * len(rl.IMPLEMENTATIONS) - len(unsupported)
    kernels = pd.read_csv(tmp_path / "run" / predicted.KERNELS_CSV)
    assert {"term", "kernel", "time_us", "bound"} <= set(kernels.columns) and len(kernels) > len(rows)
    metadata = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert metadata["prediction_only"] is True and set(metadata["ceilings"]) == {"spec"}


def test_roofline_cli_filters_recipes_and_implementations(tmp_path, calibration_dir):
    result = _roofline(tmp_path, "--gpu", "h200", "--shape-gen", "llama", "--granularity", "rowwise", "--implementation", "triton")
    assert result.exit_code == 0, result.output
    rows = load_results(tmp_path / "run")
    assert set(rows["recipe"]) == {"bf16", "rowwise", "rowwise_with_gw_hp"}
    assert set(rows["case"]) == {s.name for s in shapes.llama()}
    # Ours is measured eager and compiled: `triton` predicts both.
    assert {json.loads(o).get("implementation", "-") for o in rows["options"]} == {"-", "triton", "triton-compile"}


def test_roofline_cli_shows_calibrated_next_to_spec(tmp_path, calibration_dir):
    save_profile(_profile(), calibration_dir / "h100-sxm.json")  # auto-discovered
    result = _roofline(tmp_path, "--gpu", "h100-sxm", "--recipe", "tensorwise", "--shape-gen", "square")
    assert result.exit_code == 0, result.output
    rows = load_results(tmp_path / "run")
    assert set(rows["options"].map(lambda o: json.loads(o)["ceilings"])) == {"spec", "calibrated"}
    assert "calibrated ceilings: measured on NVIDIA H100" in " ".join(result.output.split())


def test_roofline_cli_refuses_a_calibration_of_another_gpu(tmp_path, calibration_dir):
    path = save_profile(_profile(gpu_key="h200"), tmp_path / "h200.json")
    result = _roofline(tmp_path, "--gpu", "h100-sxm", "--calibration", str(path))
    assert result.exit_code == 2
    assert "measured on h200, not h100-sxm" in " ".join(result.output.split())


def test_roofline_cli_gpu_auto_without_a_gpu_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setattr("fp8bench.harness.env.cuda_device_name", lambda: None)
    result = _roofline(tmp_path, "--gpu", "auto")
    assert result.exit_code == 2
    assert "name one with --gpu" in " ".join(result.output.split())
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--recipe", "fp4"], "unknown recipe 'fp4'; choose one of: tensorwise, tensorwise-delayed, rowwise"),
        (["--implementation", "cutlass"], "unknown implementation 'cutlass'; choose one of: triton, torchao"),
        (["--granularity", "blockwise", "--recipe", "rowwise"], "no chosen recipe scales with granularity"),
        (["--shape-gen", "custom", "--M", "64"], "--shape-gen custom needs --K, --N"),
        (["--calibration", "missing.json"], "cannot read calibration file"),
    ],
)
def test_roofline_cli_usage_errors(tmp_path, calibration_dir, args, message):
    result = _roofline(tmp_path, "--gpu", "h100-sxm", *args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.replace("│", " ").split())


def test_calibrate_without_a_gpu_says_what_it_needs(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    result = CliRunner().invoke(app, ["calibrate", "--gpu", "h100-sxm"])
    assert result.exit_code == 1 and result.output.startswith("error: fp8bench calibrate measures on a CUDA GPU")


@pytest.mark.gpu
def test_calibrate_measures_this_gpu(tmp_path):
    from fp8bench.harness.env import cuda_device_name
    from fp8bench.model.hardware import spec_for_device_name

    spec = spec_for_device_name(cuda_device_name())
    if spec is None:
        pytest.skip(f"{cuda_device_name()} is not in the hardware table")
    path = tmp_path / "profile.json"
    result = CliRunner().invoke(app, ["calibrate", "--out", str(path), "--repeats", "2"])
    assert result.exit_code == 0, result.output
    profile = load_profile(path)
    assert profile.gpu_key == spec.key
    assert profile.environment["versions"]["torch"]
    # Achievable ceilings sit below the datasheet and FP8 beats BF16 at these sizes.
    assert 0.3 * spec.bf16_tflops < profile.bf16_tflops < 1.05 * spec.bf16_tflops
    assert profile.bf16_tflops < profile.fp8_tflops["tensorwise/on"] < 1.05 * spec.fp8_tflops
    assert 0.3 * spec.mem_bw_tbps < profile.copy_tbps < 1.05 * spec.mem_bw_tbps
    assert 0.5 < profile.launch_us < 50
    # ...and the roofline picks the profile up.
    run = CliRunner().invoke(app, ["roofline", "--no-measure", "--calibration", str(path), "--out", str(tmp_path / "run"), "--shape-gen", "custom", "--M", "8192", "--K", "8192", "--N", "8192"])
    assert run.exit_code == 0, run.output


def test_shapes_fp8_cannot_run_are_unsupported_rows(tmp_path, calibration_dir):
    """The grad_weight product reduces over M: FP8 needs M % 16, blockwise (1x128 groups) M % 128."""
    args = ["--gpu", "h100-sxm", "--shape-gen", "custom", "--K", "4096", "--N", "4096", "--implementation", "triton"]
    result = _roofline(tmp_path, *args, "--M", "8208", "--recipe", "blockwise", "--recipe", "tensorwise")
    assert result.exit_code == 0, result.output
    rows = load_results(tmp_path / "run").set_index("recipe")
    assert rows.loc["blockwise", "status"].tolist() == [
        "unsupported: the grad_weight product (4096x8208x4096): blockwise scaling needs K and N to be multiples of 128 (K=8208)"
    ] * 2  # triton, triton-compile
    assert rows.loc["tensorwise", "status"].tolist() == ["ok", "ok", "ok"]  # public, triton, triton-compile
    result = _roofline(tmp_path, *args, "--M", "8200", "--recipe", "tensorwise", "--out", str(tmp_path / "odd"))
    rows = load_results(tmp_path / "odd")
    assert rows[rows["recipe"] == "tensorwise"]["status"].tolist() == [
        "unsupported: the grad_weight product (4096x8200x4096): FP8 GEMMs need K and N to be multiples of 16 (K=8200)"
    ] * 2


def test_our_layer_norm_writes_the_blockwise_input_and_a_second_kernel_the_transposed_groups():
    """Ours (Float8LayerNormLinear): the LayerNorm writes the input's 1x128 rowwise copy (1 byte an element
    instead of BF16's 2) and a second kernel reads x again for the transposed groups (2 + 1 bytes), where a
    cast+transpose would read the stored BF16 output (2 + 2): 2 bytes an element saved, eager and compiled."""
    shape = GemmShape(8192, 4096, 2048)
    blockwise = RECIPES["blockwise"]
    for impl in (TRITON, rl.IMPLEMENTATIONS["triton-compile"]):
        kernels = rl.layer_kernels(shape, blockwise, impl)
        assert [k.name for k in kernels if k.term == "cast:input"] == ["input: LayerNorm again + cast to fp8 transposed (reads x)"]
        unfused = rl.layer_kernels(shape, blockwise, replace(impl, block_cast_in_producer=frozenset()))
        assert sum(k.bytes for k in unfused) - sum(k.bytes for k in kernels) == 2 * shape.M * shape.K


def test_our_output_gemm_applies_the_sigmoid_so_only_its_backward_is_a_kernel():
    """Ours runs the sigmoid in the output product's epilogue (fp8kernels.gemm activation): no sigmoid
    forward kernel, 4 bytes an output element fewer than with one; every other implementation has it."""
    shape = GemmShape(8192, 4096, 2048)
    for recipe in RECIPES.values():
        for impl in rl.IMPLEMENTATIONS.values():
            if impl.unsupported_reason(recipe):
                continue
            names = [k.name for k in rl.layer_kernels(shape, recipe, impl) if k.term == "sigmoid"]
            ours = impl.name in ("triton", "triton-compile")
            assert names == (["sigmoid backward"] if ours else ["sigmoid forward", "sigmoid backward"]), (impl.name, recipe.name)
            if ours:
                separate = rl.layer_kernels(shape, recipe, replace(impl, activation_in_epilogue=False))
                saved = sum(k.bytes for k in separate) - sum(k.bytes for k in rl.layer_kernels(shape, recipe, impl))
                assert saved == 4 * shape.M * shape.N


# ---- the calibration measurement, through the harness (a fake clock on the CPU) ---------------------


class _OneMillisecond:
    """Every case takes 1 ms: a made-up clock (timer `fake`), never a measurement."""

    def begin_group(self):
        pass

    def measure(self, fn, config):
        from fp8bench.harness.timing import Measurement

        fn()
        return Measurement((1.0, 1.0), 5, 1.5, "fake", ())


def test_calibration_measures_through_the_harness_and_profiles_its_rows(tmp_path, monkeypatch):
    from fp8bench.backends import REGISTRY, Level
    from fp8bench.backends.base import PreparedGemm
    from fp8bench.benchmarks import calibrate
    from fp8bench.config import FastAccum, GemmShape, Granularity, TimingConfig
    from fp8bench.harness.results import RunWriter, load_results
    from fp8bench.harness.runner import run_cases

    def tensorwise_only(operands, granularity, fast_accum):  # a stand-in cuBLAS that has tensorwise alone
        if granularity is not Granularity.TENSORWISE:
            raise RuntimeError("scaled_gemm: no such configuration")
        return PreparedGemm(lambda: operands.a @ operands.b.t())

    monkeypatch.setattr(REGISTRY["cublas"], "unavailable_reason", lambda level=Level.GEMM: None)
    monkeypatch.setattr(REGISTRY["cublas"], "prepare_gemm", tensorwise_only)
    monkeypatch.setattr(calibrate, "COPY_BYTES", 2**12)
    shapes = (GemmShape(64, 128, 256), GemmShape(128, 128, 128))
    benchmark = calibrate.CalibrationBenchmark(shapes, device="cpu")
    with RunWriter(tmp_path, {}) as writer:
        rows = run_cases(benchmark, benchmark.cases(), writer, _OneMillisecond(), TimingConfig(repeats=2))
    frame = load_results(tmp_path)
    assert len(frame) == len(shapes) * 7 + 2 and set(frame["benchmark"]) == {"calibrate"}
    assert frame.loc[frame.granularity == "axiswise", "status"].str.startswith("failed: RuntimeError").all()
    lines: list[str] = []
    profile = calibrate.profile_from_rows([r.values for r in rows], "h100-sxm", "test", shapes, on_result=lines.append)
    best = max(s.flops for s in shapes) / 1e-3 / 1e12  # the larger product in the same 1 ms
    assert profile.bf16_tflops == pytest.approx(best) and set(profile.fp8_tflops) == {"tensorwise/on", "tensorwise/off"}
    assert profile.copy_tbps == pytest.approx(2 * 2**12 / 1e-3 / 1e12) and profile.launch_us == pytest.approx(1000.0)
    assert any("fp8 axiswise/on GEMM: skipped: failed: RuntimeError" in line for line in lines)
    without_tensorwise = [r.values for r in rows if r.values["granularity"] != "tensorwise"]
    with pytest.raises(ValueError, match="tensorwise/on"):
        calibrate.profile_from_rows(without_tensorwise, "h100-sxm", "test", shapes)


# ---- prediction-only runs: report, several GPU models, the installed calibration ------------------


def _predicted_table(page) -> list[dict[str, str]]:
    """The cells of a page's `What was predicted` table, by column header."""
    from browser import parse_html

    dom = parse_html(page.read_text(encoding="utf-8"))
    (section,) = [e for e in dom.iter() if e.tag == "section" and e.attrs.get("id") == "roofline-predictions"]
    (found,) = section.find_all("table")
    header = [th.text().strip() for th in found.find_all("th")]
    return [dict(zip(header, (td.text().strip() for td in tr.find_all("td")))) for tr in found.find_all("tbody")[0].find_all("tr")]


def test_prediction_only_run_writes_a_report_comparing_two_gpu_models(tmp_path, calibration_dir):
    from browser import embedded_graphs

    shape = ["--shape-gen", "custom", "--M", "8192", "--K", "4096", "--N", "4096"]
    result = _roofline(tmp_path, "--gpu", "h100-sxm", "--gpu", "h200", "--recipe", "tensorwise", "--recipe", "blockwise",
                       "--implementation", "triton", "--implementation", "torchao", *shape)  # fmt: skip
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    assert f"report: {run / 'index.html'}" in result.output
    rows = load_results(run)
    ceilings = rows["options"].map(lambda o: json.loads(o)["ceilings"])
    assert list(dict.fromkeys(ceilings)) == ["h100-sxm spec", "h200 spec"]
    assert json.loads((run / "metadata.json").read_text())["gpu_specs"] == ["h100-sxm", "h200"]
    ok = rows[rows["status"] == "ok"]
    # the predicted split by kind of kernel adds up to the predicted step
    assert ((ok["gemm_ms"] + ok["cast_ms"] + ok["other_ms"] - ok["predicted_ms"]).abs() < 1e-5 * ok["predicted_ms"]).all()
    assert (ok["gemm_ms"] > 0).all() and (ok[ok["recipe"] != "bf16"]["cast_ms"] > 0).all()

    table = _predicted_table(run / "tensorwise.html")
    assert list(table[0]) == ["shape", "recipe", "implementation", "h100-sxm spec ceilings", "h200 spec ceilings"]
    triton = ok[(ok["recipe"] == "tensorwise") & (ok["options"].str.contains('"implementation": "triton"'))]
    (cell,) = [r for r in table if r["recipe"] == "tensorwise" and r["implementation"] == "triton"]
    for source, row in zip(ceilings[triton.index], triton.itertuples()):
        assert cell[f"{source} ceilings"] == f"{row.predicted_speedup:.2f}x, {row.predicted_ms:.4g} ms, {row.bound}-bound"
    (torchao,) = [r for r in _predicted_table(run / "blockwise.html") if r["implementation"] == "torchao"]
    assert torchao["h200 spec ceilings"].startswith("unsupported: torchao has no blockwise recipe")

    graphs = {g.div_id: g for g in embedded_graphs((run / "tensorwise.html").read_text(encoding="utf-8"))}
    breakdown = graphs["roofline-predicted-time-8192x4096x4096"]
    # a GEMM, cast and other bar for each step under each GPU's ceilings, where the step has such kernels
    on_page = ok[ok["recipe"].isin(["tensorwise", "bf16"])]
    assert sum(t.points for t in breakdown.traces) == int((on_page[["gemm_ms", "cast_ms", "other_ms"]] > 0).to_numpy().sum())
    assert "roofline-speedup" in graphs


def test_prediction_only_run_without_report_writes_no_pages(tmp_path, calibration_dir):
    result = _roofline(tmp_path, "--gpu", "h100-sxm", "--recipe", "tensorwise", "--no-report", "--shape-gen", "custom",
                       "--M", "1024", "--K", "1024", "--N", "1024")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "report:" not in result.output and not list((tmp_path / "run").glob("*.html"))


def test_the_installed_calibration_profile_is_found_from_any_folder(tmp_path, monkeypatch):
    installed = calibration.default_profile_path("h100-sxm")
    assert installed.is_file(), "the checkout's calibration/h100-sxm.json"
    monkeypatch.chdir(tmp_path)  # a folder without calibration/
    result = _roofline(tmp_path, "--gpu", "h100-sxm", "--recipe", "tensorwise", "--no-report", "--shape-gen", "custom",
                       "--M", "4096", "--K", "4096", "--N", "4096")  # fmt: skip
    assert result.exit_code == 0, result.output
    metadata = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert set(metadata["ceilings"]) == {"spec", "calibrated"}
    assert f"from {installed}" in metadata["ceilings"]["calibrated"]


def test_the_console_says_why_a_cell_is_empty(tmp_path, calibration_dir):
    result = CliRunner().invoke(
        app,
        ["roofline", "--no-measure", "--no-report", "--gpu", "h100-sxm", "--recipe", "blockwise", "--implementation", "triton",
         "--implementation", "torchao", "--shape-gen", "custom", "--M", "8208", "--K", "4096", "--N", "4096", "--out", str(tmp_path / "run")],
        env={"COLUMNS": "250"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("│ 8208x4096x4096")]
    cells = [cell.strip() for cell in line.strip("│").split("│")]
    # shape, ceilings, bf16 ms, fp8 ms, public, triton, triton-compile, torchao, fp8 bound
    assert cells[3:] == ["unsupported", "unsupported", "unsupported", "unsupported", "no such recipe", "unsupported"]
    text = " ".join(result.output.split())
    assert "torchao: no such recipe: torchao has no blockwise recipe" in text
    assert "8208x4096x4096: unsupported: the grad_weight product (4096x8208x4096): blockwise scaling needs K and N" in text


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gpu", "h100-sxm", "--gpu", "h200", "--calibration", "x.json"], "--calibration is one GPU's profile"),
        (["--gpu", "h100-sxm", "--gpu", "a100"], "unknown GPU 'a100'"),
    ],
)
def test_several_gpus_usage_errors(tmp_path, calibration_dir, args, message):
    result = _roofline(tmp_path, *args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.replace("│", " ").split())


def test_measuring_is_for_this_gpu_only(tmp_path, calibration_dir, monkeypatch):
    monkeypatch.setattr("fp8bench.harness.env.cuda_device_name", lambda: "NVIDIA H100 80GB HBM3")
    result = CliRunner().invoke(app, ["roofline", "--gpu", "h100-sxm", "--gpu", "h200", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "--gpu h100-sxm, h200 is not just this NVIDIA H100 80GB HBM3; add --no-measure" in " ".join(result.output.replace("│", " ").split())
    assert not (tmp_path / "run").exists()
