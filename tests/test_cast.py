"""`fp8bench cast` on the CPU: recipes, shapes, byte counts, the check of our kernels against the
reference, and whole runs (our kernels under TRITON_INTERPRET=1, timed by a fake clock whose rows
say `fake` and go only to a temporary folder). On a GPU, one small real run."""

from __future__ import annotations

import json
import os
import random
import statistics

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: Triton reads it then

from fp8bench.backends import REGISTRY  # noqa: E402
from fp8bench.backends.quantize import Quantizer  # noqa: E402
from fp8bench.benchmarks import cast  # noqa: E402
from fp8bench.harness.runner import run_cases  # noqa: E402
from fp8bench.config import BLOCK, Granularity, TimingConfig  # noqa: E402
from fp8bench.nn.recipes import Fp8Dtype  # noqa: E402
from fp8bench.harness.results import RunWriter, load_results  # noqa: E402
from fp8bench.harness.timing import measure  # noqa: E402
from fp8kernels.quantize import QuantizedTensor  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
FAST_TIMING = TimingConfig(repeats=2, settle_ms=0.0, warmup_ms=0.0, samples_ms=1.0, min_samples=3, max_samples=3)


def exact_input(shape: cast.CastShape, dtype_name: str, device: str = DEVICE, seed: int = 0) -> torch.Tensor:
    """Values the kernels quantize without rounding, so that the interpreter's faulty fp8 rounding
    (see test_kernels_quantize) does not enter: +-2^k * {1, 1.25, 1.5, 1.75} (on both fp8 grids) and,
    in every row, column and 128-block, a 256, so that with power-of-two scales every group's
    multiplier is an exact power of two (1 for e4m3, 128 for e5m2)."""
    generator = torch.Generator().manual_seed(seed)
    rows, cols = shape.rows, shape.cols
    mantissa = 1 + 0.25 * torch.randint(0, 4, (rows, cols), generator=generator)
    sign = 1 - 2 * torch.randint(0, 2, (rows, cols), generator=generator)
    x = sign * mantissa * torch.exp2(torch.randint(-6, 7, (rows, cols), generator=generator).float())
    x[:, ::BLOCK] = 256.0
    x[::BLOCK, :] = 256.0
    return x.to(getattr(torch, cast.INPUT_DTYPES[dtype_name])).to(device)


class FakeTimer:
    """Runs the case once (so it must work) and reports random milliseconds; never a GPU number."""

    name = "fake"
    sample_overhead_ms = 0.0

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def run(self, fn, calls):
        fn()

    def estimate_ms(self, fn, count):
        return statistics.median(self.samples(fn, count))

    def samples(self, fn, count):
        return [self.rng.uniform(0.5, 1.5) for _ in range(count)]

    def wall_ms(self, fn, count):
        return self.rng.uniform(1.0, 2.0)

    def sm_clock_mhz(self):
        return None

    def max_sm_clock_mhz(self):
        return None


class FakeTimers:
    def __init__(self):
        self.timer = FakeTimer()

    def begin_group(self):
        pass

    def measure(self, fn, config):
        return measure(fn, config, self.timer)


def test_recipes_are_named_and_validated():
    assert list(cast.CAST_RECIPES) == [
        "tensorwise", "tensorwise+t", "tensorwise-delayed", "tensorwise-delayed+t", "axiswise", "axiswise+t",
        "blockwise-1x128", "blockwise-1x128+t", "blockwise-128x128", "blockwise-128x128+t",
    ]  # fmt: skip
    assert cast.RECIPE_CHOICES["all"] == tuple(cast.CAST_RECIPES.values())
    with pytest.raises(ValueError, match="FP8 granularity"):
        cast.CastRecipe(Granularity.NONE)
    with pytest.raises(ValueError, match="block_rows"):
        cast.CastRecipe(Granularity.BLOCKWISE, 64)
    with pytest.raises(ValueError, match="block_rows"):
        cast.CastRecipe(Granularity.AXISWISE, 1)
    with pytest.raises(ValueError, match="delayed"):
        cast.CastRecipe(Granularity.AXISWISE, delayed=True)


def test_blockwise_recipes_say_which_shapes_they_cannot_take():
    ragged = cast.CastShape(17, 256)
    assert cast.CAST_RECIPES["blockwise-1x128"].problem_with(ragged) is None
    assert "both sides" in cast.CAST_RECIPES["blockwise-1x128+t"].problem_with(ragged)
    assert "both sides" in cast.CAST_RECIPES["blockwise-128x128"].problem_with(ragged)
    assert "column count" in cast.CAST_RECIPES["blockwise-1x128"].problem_with(cast.CastShape(128, 200))
    assert cast.CAST_RECIPES["axiswise+t"].problem_with(cast.CastShape(17, 33)) is None


@pytest.mark.parametrize("name", list(cast.CAST_RECIPES))
def test_bytes_written_are_what_our_kernels_write(name):
    """The byte count behind GB/s equals the sizes of the tensors our kernel returns."""
    recipe = cast.CAST_RECIPES[name]
    shape = cast.CastShape(256, 384)
    x = cast.random_input(shape, "bf16", DEVICE)
    out = _quantizer("triton", cast.CastConfig((shape,), (recipe,)), recipe, x).run(x)
    tensors = {id(t): t for t in (out.data, out.scale, out.data_t, out.scale_t) if t is not None}  # a shared scale once
    recorded_amax = 4 if recipe.delayed else 0
    assert recipe.bytes_written(shape) == sum(t.numel() * t.element_size() for t in tensors.values()) + recorded_amax
    assert recipe.input_reads() == {"tensorwise": 2, "tensorwise+t": 2, "axiswise+t": 2}.get(name, 1)


def test_shape_generators():
    assert [s.name for s in cast.generate_shapes("square")] == ["4096x4096", "8192x8192", "16384x16384"]
    llama = cast.generate_shapes("llama")
    assert len({(s.rows, s.cols) for s in llama}) == len(llama) > 0
    assert all(s.name.endswith(".input") for s in llama)
    assert cast.generate_shapes("custom", 5, 7) == [cast.CastShape(5, 7)]
    for args, message in ((("custom", 5, None), "--M"), (("square", 5, 7), "only go with"), (("cubes",), "unknown shape")):
        with pytest.raises(ValueError, match=message):
            cast.generate_shapes(*args)
    with pytest.raises(ValueError, match="positive"):
        cast.CastShape(0, 4)


def test_config_is_validated():
    shape, recipe = cast.CastShape(4, 4), cast.CAST_RECIPES["tensorwise"]
    with pytest.raises(ValueError, match="unknown implementation"):
        cast.CastConfig((shape,), (recipe,), ("tpu",))
    with pytest.raises(ValueError, match="input dtype"):
        cast.CastConfig((shape,), (recipe,), input_dtype="int8")
    with pytest.raises(ValueError, match="at least one"):
        cast.CastConfig((), (recipe,))


def _fp8(values, dtype=torch.float8_e4m3fn):
    return torch.tensor(values, dtype=torch.float32).to(dtype).reshape(1, -1)


def test_comparison_with_the_reference_counts_one_ulp_and_rejects_more():
    scale = torch.ones(1, 1)
    reference = QuantizedTensor(_fp8([1.0, 2.0, -3.0, 0.0]), scale, None, None)
    assert cast.compare_with_reference(reference, reference) == (0, None)
    one_ulp = QuantizedTensor(_fp8([1.125, 2.0, -3.25, 0.0]), scale, None, None)  # e4m3 spacing: 1/8 at 1, 1/4 at 2
    assert cast.compare_with_reference(one_ulp, reference) == (2, None)
    two_ulps = QuantizedTensor(_fp8([1.25, 2.0, -3.0, 0.0]), scale, None, None)
    assert "more than one ulp" in cast.compare_with_reference(two_ulps, reference)[1]
    flipped = QuantizedTensor(_fp8([1.0, 2.0, 3.0, 0.0]), scale, None, None)
    assert "more than one ulp" in cast.compare_with_reference(flipped, reference)[1]
    wrong_scale = QuantizedTensor(reference.data, scale * 2, None, None)
    assert "scales differ" in cast.compare_with_reference(wrong_scale, reference)[1]
    missing_copy = QuantizedTensor(reference.data, scale, None, None)
    with_copy = QuantizedTensor(reference.data, scale, reference.data.t().contiguous(), scale)
    assert "wrong shape" in cast.compare_with_reference(missing_copy, with_copy)[1]


@pytest.mark.parametrize("name", ["axiswise+t", "blockwise-1x128+t", "blockwise-128x128", "tensorwise-delayed+t"])
def test_reference_function_writes_our_layouts(name):
    recipe = cast.CAST_RECIPES[name]
    shape = cast.CastShape(256, 384)
    x = exact_input(shape, "bf16")
    config = cast.CastConfig((shape,), (recipe,), power_of_two=True)
    ours, reference = (_quantizer(name, config, recipe, x).run(x) for name in ("triton", "torch"))
    for got, want in ((ours.scale, reference.scale), (ours.scale_t, reference.scale_t)):
        assert (got is None) == (want is None)
        if got is not None:
            assert got.shape == want.shape and got.stride() == want.stride()
    assert cast.compare_with_reference(ours, reference) == (0, None)


def _quantizer(backend: str, config, recipe, x):
    """A backend's quantizer for the recipe as a cast case builds it (a delayed recipe scales from x's amax)."""
    history_amax = x.abs().amax().float() if recipe.delayed else None
    return REGISTRY[backend].quantizer(recipe, cast.quantize_spec(config, recipe), history_amax)


def _run(tmp_path, config, monkeypatch):
    monkeypatch.setattr(cast, "random_input", exact_input)
    benchmark = cast.CastBenchmark(config, DEVICE)
    with RunWriter(tmp_path, {"command": "test"}) as writer:
        rows = run_cases(benchmark, benchmark.cases(), writer, FakeTimers(), config.timing)
    return rows, load_results(tmp_path)


@pytest.mark.skipif(ON_GPU, reason="the fake-clock run is the CPU stand-in; the GPU runs the real one below")
def test_a_whole_run_writes_one_row_per_case(tmp_path, monkeypatch):
    shapes = (cast.CastShape(17, 256, "ragged"), cast.CastShape(128, 256))
    recipes = tuple(cast.CAST_RECIPES[name] for name in ("tensorwise+t", "tensorwise-delayed", "axiswise", "blockwise-128x128"))
    config = cast.CastConfig(shapes, recipes, ("triton", "torch", "te"), Fp8Dtype.E5M2, power_of_two=True, timing=FAST_TIMING)
    rows, frame = _run(tmp_path, config, monkeypatch)
    assert len(frame) == len(rows) == len(shapes) * (1 + len(recipes) * 3)
    assert set(frame["benchmark"]) == {"cast"} and set(frame.loc[frame.status == "ok", "timer"]) == {"fake"}
    status = {(r.case, r.recipe, r.backend): r.status for r in frame.itertuples()}
    assert status[("ragged", "copy", "torch")] == "ok"
    assert status[("ragged", "blockwise-128x128", "triton")].startswith("unsupported: blockwise-128x128 needs both sides")
    assert status[("128x256", "axiswise", "te")].startswith("unsupported: transformer_engine")
    ok_cases = (("ragged", "tensorwise+t", "triton"), ("ragged", "tensorwise-delayed", "triton"),
                ("128x256", "blockwise-128x128", "torch"), ("128x256", "axiswise", "triton"))  # fmt: skip
    for key in ok_cases:
        assert status[key] == "ok", key
    ok = frame[(frame.status == "ok") & (frame.recipe != "copy")]
    copies = frame[frame.recipe == "copy"].set_index("case")["gbps"]
    recomputed = 100 * ok["gbps"] / ok["case"].map(copies)
    assert ((ok["pct_peak"] - recomputed).abs() / recomputed).max() < 1e-5  # the CSV keeps 6 significant digits
    assert (ok["rel_err"] == 0).all()  # exact inputs come back exactly from every implementation
    options = json.loads(frame[(frame.backend == "triton") & (frame.status == "ok")].iloc[0]["options"])
    assert {"config", "bytes", "bytes_moved", "fp8"} <= set(options) and options["fp8"] == "e5m2"
    assert options["one_ulp_from_reference"] == 0


@pytest.mark.skipif(ON_GPU, reason="CPU stand-in")
def test_a_wrong_or_broken_implementation_fails_its_row_and_the_run_goes_on(tmp_path, monkeypatch):
    ours = REGISTRY["triton"].quantizer

    def wrong_scale(recipe, spec, history_amax):
        good = ours(recipe, spec, history_amax)
        return Quantizer(lambda x: QuantizedTensor(good.run(x).data, good.run(x).scale * 2, None, None), good.dequantize)

    def broken(recipe, spec, history_amax):
        raise RuntimeError("no kernel image\nsecond line")

    monkeypatch.setattr(REGISTRY["triton"], "quantizer", wrong_scale)
    monkeypatch.setattr(REGISTRY["torch-compile"], "quantizer", broken)
    config = cast.CastConfig((cast.CastShape(64, 128),), (cast.CAST_RECIPES["tensorwise"],), ("triton", "torch-compile", "torch"), timing=FAST_TIMING)
    _, frame = _run(tmp_path, config, monkeypatch)
    status = dict(zip(frame.backend + "/" + frame.recipe, frame.status))
    assert status["triton/tensorwise"] == "failed: 1 rowwise scales differ from the reference"
    assert status["torch-compile/tensorwise"] == "failed: RuntimeError: no kernel image"
    assert status["torch/tensorwise"] == "ok" and status["torch/copy"] == "ok"


def test_console_output_shows_each_row_and_a_table(tmp_path, capsys, monkeypatch):
    from rich.console import Console

    config = cast.CastConfig((cast.CastShape(64, 128),), (cast.CAST_RECIPES["axiswise"],), ("triton", "te"), timing=FAST_TIMING)
    rows, _ = _run(tmp_path, config, monkeypatch)
    console = Console(width=200)
    for row in rows:
        cast.print_cast_row(console, row)
    cast.print_cast_summary(console, rows)
    printed = capsys.readouterr().out
    assert "GB/s" in printed and "% of copy" in printed and "unsupported" in printed and "triton % of copy" in printed


def test_cli_rejects_bad_options_before_touching_a_gpu():
    from typer.testing import CliRunner

    from fp8bench.cli import app

    runner = CliRunner()
    for args, message in (
        (["--recipe", "bogus"], "unknown recipe"),
        (["--dtype", "e3m4"], "unknown fp8 dtype"),
        (["--backend", "tpu"], "unknown implementation"),
        (["--input-dtype", "int8"], "input dtype"),
        (["--shape-gen", "custom", "--M", "4"], "--M (rows) and --K"),
        (["--timer", "sundial"], "unknown timer"),
    ):
        result = runner.invoke(app, ["cast", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in " ".join(result.output.split()), (args, result.output)


def test_suites_may_run_cast(tmp_path):
    from fp8bench.harness.suite import load_suite

    path = tmp_path / "s.toml"
    path.write_text('[[bench]]\nname = "casts"\ncommand = "cast"\nrecipe = ["tensorwise", "axiswise+t"]\nreport = false\n')
    entry = load_suite(path).entries[0]
    assert entry.argv(tmp_path) == ["cast", "--recipe", "tensorwise", "--recipe", "axiswise+t", "--no-report", "--out", str(tmp_path / "casts")]


@pytest.mark.gpu
def test_gpu_run_measures_every_implementation(tmp_path):
    from fp8bench.harness.timing import TimerChoice

    shape = cast.CastShape(4096, 4096)
    config = cast.CastConfig((shape,), cast.RECIPE_CHOICES["all"], ("triton", "torch"), timing=TimingConfig(repeats=2))
    benchmark = cast.CastBenchmark(config)
    with RunWriter(tmp_path, {"command": "test"}) as writer:
        run_cases(benchmark, benchmark.cases(), writer, TimerChoice("auto"), config.timing)
    frame = load_results(tmp_path)
    assert (frame["status"] == "ok").all(), frame[frame.status != "ok"][["recipe", "backend", "status"]]
    ours = frame[frame.backend == "triton"]
    assert (ours["pct_peak"] > 10).all() and (ours["options"].map(lambda o: json.loads(o)["one_ulp_from_reference"]) == 0).all()


@pytest.mark.skipif(ON_GPU, reason="CPU stand-in")
def test_reports_render_cast_rows(tmp_path, monkeypatch):
    from fp8bench.report.write import write_reports

    recipes = (cast.CAST_RECIPES["tensorwise"], cast.CAST_RECIPES["blockwise-1x128+t"])
    config = cast.CastConfig((cast.CastShape(128, 256),), recipes, ("triton", "te"), timing=FAST_TIMING)
    _run(tmp_path, config, monkeypatch)
    pages = write_reports(tmp_path)
    names = sorted(page.name for page in pages)
    assert names == ["blockwise.html", "index.html", "tensorwise.html"]
    blockwise = (tmp_path / "blockwise.html").read_text()
    assert "blockwise-1x128+t" in blockwise and "cast" in blockwise


def test_cast_rows_written_with_an_empty_n_read_as_the_same_cases(tmp_path):
    """Every id column has a value: a cast has no product, its N is 0; files that left N empty read alike."""
    from fp8bench.harness.results import RESULTS_CSV

    config = cast.CastConfig((cast.CastShape(64, 128),), (cast.CAST_RECIPES["tensorwise"],), ("torch",), timing=FAST_TIMING)
    benchmark = cast.CastBenchmark(config, DEVICE)
    with RunWriter(tmp_path, {}) as writer:
        rows = run_cases(benchmark, benchmark.cases(), writer, FakeTimers(), config.timing)
    assert [r.values["N"] for r in rows] == [0, 0]
    csv_path = tmp_path / RESULTS_CSV
    lines = csv_path.read_text().splitlines()
    header = lines[0].split(",")
    n = header.index("N")
    csv_path.write_text("\n".join([lines[0], *(",".join(c if i != n else "" for i, c in enumerate(line.split(","))) for line in lines[1:])]) + "\n")
    assert "" in csv_path.read_text().splitlines()[1].split(",")[n:n + 1]
    assert list(load_results(tmp_path)["N"]) == [0, 0]
