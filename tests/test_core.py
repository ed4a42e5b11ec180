"""The skeleton on the CPU: shape generators, configuration, the result schema and writer, the timing
harness (with a fake clock), the backend registry's declarations, suites and the CLI's error paths."""

from __future__ import annotations

import csv
import math
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fp8bench.benchmarks import shapes
from fp8bench.backends import REGISTRY, get_backend
from fp8bench.cli import app, main
from fp8bench.config import (
    GRANULARITY_CHOICES,
    FastAccum,
    GemmShape,
    Granularity,
    MatmulCase,
    MatmulConfig,
    TimingConfig,
    parse_choice,
)
from fp8bench.harness.results import COLUMNS, RESULTS_CSV, Row, RunWriter, load_results
from fp8bench.harness.suite import load_suite
from fp8bench.harness import timing
from fp8bench.harness.timing import measure

runner = CliRunner()


# --- shapes ---


def test_square_is_powers_of_two_from_256_to_32768():
    got = shapes.generate("square")
    assert [s.M for s in got] == [2**i for i in range(8, 16)]
    assert all(s.M == s.K == s.N for s in got)


def test_llama_shapes_cover_both_models_and_token_counts():
    got = shapes.generate("llama")
    assert {s.M for s in got} == {8192, 16384}
    assert {s.name.split(".")[0] for s in got} == {"llama3-8b", "llama3-70b", "llama3-70b-tp8"}
    assert len({s.name for s in got}) == len(got)
    # ANCHORS.md's 70B tensor-parallel shapes are among them, e.g. 16384 x 8192 x 7168.
    assert (16384, 8192, 7168) in {(s.M, s.K, s.N) for s in got}


def test_sweep_and_custom():
    assert len(shapes.generate("sweep")) == 125
    (one,) = shapes.generate("custom", 17, 48, 96)
    assert (one.M, one.K, one.N, one.name) == (17, 48, 96, "17x48x96")


def test_shapes_kept_by_a_part_of_their_name():
    got = shapes.generate("awkward", name_parts=("moe.dsv3.w2.M1024", "skinny."))
    assert [s.name for s in got] == ["moe.dsv3.w2.M1024", "skinny.dsv3.wq_a_kv_a.M4096"]
    assert [s.name for s in shapes.generate("custom", 17, 48, 96, ("17x48",))] == ["17x48x96"]


def test_custom_products_written_mxkxn():
    got = shapes.generate("custom", products=("4096x7168x2112", "256X4096x28672"))
    assert [(s.M, s.K, s.N, s.name) for s in got] == [(4096, 7168, 2112, "4096x7168x2112"), (256, 4096, 28672, "256x4096x28672")]
    assert [s.name for s in shapes.generate("custom", 17, 48, 96, products=("32x64x16",))] == ["17x48x96", "32x64x16"]


@pytest.mark.parametrize(
    "args, message",
    [(("custom", 16, None, 32), "--K"), (("square", 16, 16, 16), "only go with"), (("cubes",), "choose one of"),
     (("square", None, None, None, ("llama",)), r"no square shape has a name containing any of \['llama'\]"),
     (("custom",), "needs --shape MxKxN"), (("custom", None, None, None, (), ("4096x7168",)), "'4096x7168' is not MxKxN"),
     (("custom", None, None, None, (), ("0x16x16",)), "is not MxKxN"), (("llama", None, None, None, (), ("16x16x16",)), "only go with")],
)
def test_shape_generator_errors(args, message):
    with pytest.raises(ValueError, match=message):
        shapes.generate(*args)


# --- configuration ---


def test_granularity_names_and_aliases():
    assert parse_choice("rowwise", GRANULARITY_CHOICES, "granularity") == (Granularity.AXISWISE,)
    assert parse_choice("ALL", GRANULARITY_CHOICES, "granularity") == Granularity.fp8()
    with pytest.raises(ValueError, match="tensorwise, axiswise, rowwise, blockwise, all"):
        parse_choice("colwise", GRANULARITY_CHOICES, "granularity")


def test_frozen_configs_validate_once():
    with pytest.raises(ValueError, match="positive integer"):
        GemmShape(0, 16, 16)
    with pytest.raises(ValueError, match="fast-accumulation"):
        MatmulCase(GemmShape(16, 16, 16), "cublas", Granularity.TENSORWISE, FastAccum.NA)
    with pytest.raises(ValueError, match="repeats"):
        TimingConfig(repeats=0)


def test_cases_measure_bf16_first_for_each_shape():
    config = MatmulConfig(
        (GemmShape(256, 256, 256), GemmShape(512, 512, 512)),
        (Granularity.TENSORWISE, Granularity.BLOCKWISE),
        ("bf16", "cublas"),
        (FastAccum.ON, FastAccum.OFF),
    )
    cases = config.cases()
    assert len(cases) == 2 * (1 + 2 * 2)
    assert [c.backend for c in cases[:5]] == ["bf16", "cublas", "cublas", "cublas", "cublas"]
    assert [c.shape.M for c in cases] == [256] * 5 + [512] * 5


# --- backends: what each declares ---


def test_registry_declares_capabilities():
    assert {"bf16", "cublas", "triton"} <= set(REGISTRY)
    with pytest.raises(ValueError, match="choose one of"):
        get_backend("cutlass")


def test_every_implementation_is_one_backend_declaring_its_levels():
    from fp8bench.backends import Level, Unsupported, backend_names, default_backend_names
    from fp8bench.backends.quantize import CAST_RECIPES

    assert backend_names(Level.GEMM) == ["bf16", "cublas", "triton", "triton-tuned"]  # our GEMM on two configs
    assert default_backend_names(Level.GEMM) == ["bf16", "cublas", "triton"]  # tuning runs where it is asked for
    assert backend_names(Level.CAST) == ["triton", "torch", "torch-compile", "te"]
    assert set(backend_names(Level.LAYER)) == {"bf16", "triton", "te", "torchao"}
    assert set(backend_names(Level.MODEL)) == {"bf16", "triton", "te", "torchao", "te-layer"}  # TE's TransformerLayer: models only
    with pytest.raises(ValueError, match="choose one of: bf16, cublas, triton, triton-tuned"):
        get_backend("te", Level.GEMM)
    te = get_backend("te")
    assert te.unavailable_reason(Level.GEMM) == "te has no gemm level"
    assert "no GEMM" in te.unsupported_reason(GemmShape(256, 256, 256), Granularity.TENSORWISE, FastAccum.ON)
    with pytest.raises(Unsupported, match="cublas has no quantize kernels"):
        get_backend("cublas").quantizer(CAST_RECIPES["tensorwise"], None, None)
    with pytest.raises(Unsupported, match="cublas does not convert models"):  # the model level's converter: per backend
        get_backend("cublas").convert_model(None, None, lambda name: True, False, None)


@pytest.mark.parametrize(
    "backend, shape, granularity, fast_accum, reason",
    [
        ("cublas", GemmShape(256, 200, 256), Granularity.TENSORWISE, FastAccum.ON, "multiples of 16"),
        ("cublas", GemmShape(256, 256, 192), Granularity.BLOCKWISE, FastAccum.OFF, "multiples of 128"),
        ("cublas", GemmShape(256, 256, 256), Granularity.BLOCKWISE, FastAccum.ON, "fast-accumulation"),
        ("cublas", GemmShape(256, 384, 256), Granularity.BLOCKWISE, FastAccum.OFF, "multiple of 512"),
        ("bf16", GemmShape(256, 256, 256), Granularity.TENSORWISE, FastAccum.ON, "no tensorwise"),
    ],
)
def test_unsupported_cases_say_why(backend, shape, granularity, fast_accum, reason):
    assert reason in get_backend(backend).unsupported_reason(shape, granularity, fast_accum)


def test_supported_case_has_no_reason():
    shape = GemmShape(4096, 4096, 4096)
    assert get_backend("cublas").unsupported_reason(shape, Granularity.BLOCKWISE, FastAccum.OFF) is None


# --- result schema and writer ---


def _row(case: str, median: float) -> Row:
    return Row({"benchmark": "matmul", "case": case, "M": 16, "K": 16, "N": 16, "granularity": "none",
                "backend": "bf16", "recipe": "bf16", "fast_accum": "n/a", "options": "{}", "status": "ok",
                "median_ms": median, "repeat_ms": f"{median};{median}"})


def test_rows_reach_the_csv_as_they_are_appended(tmp_path):
    with RunWriter(tmp_path, {"command": "test"}) as writer:
        for i, median in enumerate(random.Random(1).uniform(0.1, 2.0) for _ in range(3)):
            writer.append(_row(f"case{i}", median))
            with (tmp_path / RESULTS_CSV).open() as f:  # read while the writer is still open
                assert len(list(csv.reader(f))) == i + 2
    frame = load_results(tmp_path)
    assert list(frame.columns) == list(COLUMNS) and frame["M"].dtype == "int64"
    assert frame["tflops"].isna().all()


def test_writer_refuses_to_append_to_another_schema(tmp_path):
    (tmp_path / RESULTS_CSV).write_text("case,median_ms\nx,1\n")
    with pytest.raises(ValueError, match="another result schema"):
        RunWriter(tmp_path, {}, resume=True)


def test_a_resumed_matmul_run_keeps_finished_shapes_and_measures_the_rest(tmp_path):
    from fp8bench.benchmarks.matmul import MatmulBenchmark
    from fp8bench.harness.runner import case_row, resume

    square = shapes.generate("square", None, None, None)[:3]
    config = MatmulConfig(tuple(square), (Granularity.TENSORWISE,), ("bf16", "cublas"), (FastAccum.ON, FastAccum.OFF))
    benchmark = MatmulBenchmark()
    cases = benchmark.cases(config)  # per shape: bf16, then cublas on / off
    with RunWriter(tmp_path, {}) as writer:
        for case in cases[:5]:  # the first shape whole, the second without its last case
            writer.append(case_row(benchmark, case, "ok", {"chosen": "config of the first call"}))
    left = resume(cases, tmp_path)
    assert left == cases[3:]
    assert list(load_results(tmp_path)["case"]) == [square[0].name] * 3
    with RunWriter(tmp_path, {}, resume=True) as writer:  # the resumed run appends under the same header
        writer.append(case_row(benchmark, left[0], "ok"))
    assert len(load_results(tmp_path)) == 4


def test_old_results_read_with_new_columns_empty(tmp_path):
    with RunWriter(tmp_path, {}) as writer:
        writer.append(_row("a", 1.0))
    lines = (tmp_path / RESULTS_CSV).read_text().splitlines()
    header = lines[0].split(",")
    keep = [i for i, name in enumerate(header) if name != "rel_err"]
    (tmp_path / RESULTS_CSV).write_text("\n".join(",".join(line.split(",")[i] for i in keep) for line in lines) + "\n")
    assert load_results(tmp_path)["rel_err"].isna().all()


def test_unknown_column_is_refused():
    with pytest.raises(KeyError, match="not in the result schema"):
        Row({"speed": 1})


# --- the timing harness, with a fake clock ---


class FakeTimer:
    """A GPU whose kernels run `ramp_factor` times slower during its first `ramp_ms` of work (a clock and
    power ramp, compilation), then take `base_ms` with `noise` relative noise, and `step_factor` times
    that from `step_ms` of work on (a card heating under its cap); records what the harness asked of it."""

    name = "fake"

    def __init__(self, base_ms: float, ramp_ms: float = 0.0, ramp_factor: float = 1.0, seed: int = 0,
                 clock_mhz: float = 1500.0, max_clock_mhz: float | None = None, flush_ms: float = 0.0,
                 noise: float = 0.01, step_ms: float = math.inf, step_factor: float = 1.0):
        self.base_ms, self.ramp_ms, self.ramp_factor = base_ms, ramp_ms, ramp_factor
        self.noise, self.step_ms, self.step_factor = noise, step_ms, step_factor
        self.clock_mhz, self.max_clock_mhz, self.sample_overhead_ms = clock_mhz, max_clock_mhz, flush_ms
        self.busy_ms = 0.0
        self.sample_batches: list[int] = []
        self.rng = random.Random(seed)

    def _call(self) -> float:
        if self.busy_ms < self.ramp_ms:
            ms = self.base_ms * self.ramp_factor
        else:
            step = self.step_factor if self.busy_ms >= self.step_ms else 1.0
            ms = self.base_ms * step * (1 + self.noise * self.rng.gauss(0, 1))
        self.busy_ms += ms
        return ms

    def run(self, fn, calls):
        for _ in range(calls):
            self._call()

    def estimate_ms(self, fn, count):
        return statistics.median(self.samples(fn, count))

    def samples(self, fn, count):
        self.sample_batches.append(count)
        return [self._call() for _ in range(count)]

    def wall_ms(self, fn, count):
        return statistics.median(self._call() for _ in range(count)) + 0.01

    def sm_clock_mhz(self):
        return self.clock_mhz + self.rng.uniform(-50, 50)

    def max_sm_clock_mhz(self):
        return self.max_clock_mhz


def test_warm_up_and_settling_are_not_in_the_result():
    # 80 ms of 5x slower kernels: the first estimate sees only slow calls; settling (100 ms by that
    # estimate) outlasts the ramp, so no timed sample falls in it.
    timer = FakeTimer(base_ms=0.5, ramp_ms=80.0, ramp_factor=5.0)
    config = TimingConfig(repeats=5, settle_ms=100.0, warmup_ms=10.0, samples_ms=20.0, min_samples=5, max_samples=100)
    m = measure(lambda: None, config, timer)
    assert len(m.repeat_ms) == len(m.sm_clock_mhz) >= config.min_repeats
    assert m.median_ms == pytest.approx(0.5, rel=0.02) and max(m.repeat_ms) < 0.52
    assert m.spread_pct < 3.0
    assert all(abs(n - 20.0 / 0.5) <= 1 for n in timer.sample_batches[2:])  # sized from the settled estimate
    assert m.timer == "fake" and m.wall_ms > m.median_ms


def test_sample_count_follows_the_time_budget_within_bounds():
    config = TimingConfig(repeats=2, settle_ms=0.0, warmup_ms=0.0, samples_ms=10.0, min_samples=4, max_samples=30)
    fast = FakeTimer(base_ms=0.1)
    slow = FakeTimer(base_ms=8.0)
    measure(lambda: None, config, fast)
    measure(lambda: None, config, slow)
    assert fast.sample_batches[2:] == [30, 30]  # 10 ms / 0.1 ms = 100, capped
    assert slow.sample_batches[2:] == [4, 4]  # 10 ms / 8 ms = 2, raised to the minimum


def test_a_throttled_clock_gets_repeats_long_enough_to_span_its_swing():
    """Settled below 90% of the maximum clock, each repeat runs throttled_samples_ms; a sample's
    length counts its flush, so the window is wall time, not kernel time alone."""
    config = TimingConfig(repeats=2, settle_ms=0.0, warmup_ms=0.0, samples_ms=10.0, throttled_samples_ms=100.0)
    capped = FakeTimer(base_ms=0.8, clock_mhz=1400.0, max_clock_mhz=1980.0, flush_ms=0.2)
    boost = FakeTimer(base_ms=0.8, clock_mhz=1950.0, max_clock_mhz=1980.0, flush_ms=0.2)
    unknown = FakeTimer(base_ms=0.8, clock_mhz=1400.0, max_clock_mhz=None, flush_ms=0.2)
    assert measure(lambda: None, config, capped).throttled
    assert all(abs(n - 100) <= 2 for n in capped.sample_batches[2:])  # 100 ms / (0.8 + 0.2) ms
    for timer in (boost, unknown):
        assert not measure(lambda: None, config, timer).throttled
        assert all(abs(n - 10) <= 1 for n in timer.sample_batches[2:])


def test_an_estimate_made_to_pick_the_timer_is_not_made_again():
    """TimerChoice('auto') runs the first call and estimates to pick a timer; measure() then skips both."""
    config = TimingConfig(repeats=3, settle_ms=0.0, warmup_ms=0.0, samples_ms=10.0)
    fresh, given = FakeTimer(base_ms=1.0, noise=0.0), FakeTimer(base_ms=1.0, noise=0.0)
    measure(lambda: None, config, fresh)
    measure(lambda: None, config, given, first_estimate_ms=1.0)
    assert fresh.sample_batches[:2] == [3, 3] and given.sample_batches[:1] == [3]  # the settled estimate only
    assert fresh.sample_batches[2:] == given.sample_batches[1:]
    assert given.busy_ms == pytest.approx(fresh.busy_ms - 4.0)  # one first call and three estimate calls fewer


class CaseTimer(FakeTimer):
    """Kernels as long as the measured function returns (ms), no noise; records which case it timed."""

    def __init__(self, name: str, timed: list):
        super().__init__(base_ms=1.0, noise=0.0)
        self.name, self.timed = name, timed

    def samples(self, fn, count):
        self.timed.append((self.name, fn()))
        return [fn()] * count

    def estimate_ms(self, fn, count):
        return fn()

    def enqueue_ms(self, fn, count):
        return 0.001  # a host that runs far ahead: no case is launch-bound


def test_auto_picks_one_timer_for_a_group_at_its_first_case(monkeypatch):
    """Within a group (one shape's backends) the first case picks the timer of every case, with CUPTI below
    GROUP_CUPTI_BELOW_MS; outside groups each case picks its own."""
    timed = []
    monkeypatch.setattr(timing, "GpuClock", lambda flush_l2: None)
    monkeypatch.setattr(timing, "CudaEventTimer", lambda gpu: CaseTimer("events", timed))
    monkeypatch.setattr(timing, "CuptiTimer", lambda gpu: CaseTimer("cupti", timed))
    config = TimingConfig(repeats=2, settle_ms=0.0, warmup_ms=0.0, samples_ms=1.0, min_repeats=2)
    clock = timing.TimerChoice("auto")
    assert timing.CUPTI_BELOW_MS < 0.5 < timing.GROUP_CUPTI_BELOW_MS < 2.0

    def timers_of(*case_ms):
        timed.clear()
        for ms in case_ms:
            clock.measure(lambda ms=ms: ms, config)
        return {name for name, ms in timed}

    assert timers_of(0.5, 0.01) == {"events", "cupti"}  # no group: each case its own
    clock.begin_group()
    assert timers_of(0.5, 2.0) == {"cupti"}  # the first, under a millisecond, picks CUPTI for both
    clock.begin_group()
    assert timers_of(2.0, 0.01) == {"events"}


def test_a_drifting_case_is_timed_on_its_first_stable_window():
    """Kernels 5% slower from the third repeat on (a card still heating): the harness drops repeats
    until its last five agree, and says how many it dropped."""
    config = TimingConfig(repeats=5, settle_ms=0.0, warmup_ms=0.0, samples_ms=10.0, min_samples=5)
    drifting = FakeTimer(base_ms=1.0, noise=0.001, step_ms=26.0, step_factor=1.05)  # 6 estimate calls + 2 repeats
    m = measure(lambda: None, config, drifting)
    assert 1 <= m.dropped_repeats <= config.max_dropped_repeats
    assert len(m.repeat_ms) == 5 and len(m.sm_clock_mhz) == 5
    assert m.median_ms == pytest.approx(1.05, rel=0.005) and m.spread_pct <= config.stable_spread_pct
    steady = measure(lambda: None, config, FakeTimer(base_ms=1.0, noise=0.001))
    assert steady.dropped_repeats == 0


def test_repeats_that_agree_end_the_case_at_min_repeats():
    """Steady kernels converge after `min_repeats`; noisy ones (2% per sample, repeats scattering above the 0.5% target)
    take the full window of `repeats`."""
    config = TimingConfig(repeats=5, settle_ms=0.0, warmup_ms=0.0, samples_ms=10.0, min_samples=5, max_samples=5)
    steady = measure(lambda: None, config, FakeTimer(base_ms=1.0, noise=0.0005))
    assert len(steady.repeat_ms) == config.min_repeats == 3 and steady.spread_pct <= config.converged_spread_pct
    noisy_timer = FakeTimer(base_ms=1.0, noise=0.02, seed=5)
    noisy = measure(lambda: None, config, noisy_timer)
    assert len(noisy.repeat_ms) == config.repeats and noisy.spread_pct > config.converged_spread_pct
    every_repeat = measure(lambda: None, replace(config, min_repeats=5), FakeTimer(base_ms=1.0, noise=0.0005))
    assert len(every_repeat.repeat_ms) == 5
    with pytest.raises(ValueError, match="min_repeats"):
        TimingConfig(min_repeats=1)


def test_a_case_that_never_settles_keeps_its_spread():
    config = TimingConfig(repeats=5, settle_ms=0.0, warmup_ms=0.0, samples_ms=5.0, min_samples=5, max_samples=5)
    timer = FakeTimer(base_ms=1.0, noise=0.3, seed=3)
    m = measure(lambda: None, config, timer)
    assert m.dropped_repeats == config.max_dropped_repeats
    assert len(timer.sample_batches) == 2 + config.repeats + config.max_dropped_repeats
    assert m.spread_pct > config.stable_spread_pct


def test_spread_is_the_interquartile_range_of_repeat_medians():
    from fp8bench.harness.timing import Measurement

    m = Measurement((1.0, 1.1, 1.2, 1.3, 5.0), samples=10, wall_ms=1.0, timer="fake", sm_clock_mhz=())
    assert m.median_ms == 1.2
    assert m.spread_pct == pytest.approx(100 * (1.3 - 1.1) / 1.2)  # the odd 5.0 repeat does not dominate


# --- suites ---


def test_suite_entries_become_command_lines(tmp_path):
    suite = tmp_path / "s.toml"
    suite.write_text('name = "s"\nout = "reports/{gpu}"\n[[bench]]\nname = "a"\ncommand = "matmul"\n'
                     'shape-gen = "square"\nbackend = ["bf16", "cublas"]\nreport = false\n')
    (entry,) = load_suite(suite).entries
    assert entry.argv(Path("out")) == ["matmul", "--shape-gen", "square", "--backend", "bf16", "--backend", "cublas",
                                       "--no-report", "--out", "out/a"]
    base = tmp_path / "runs"
    assert "--resume" not in entry.argv(base, resume=True)  # nothing to continue yet
    (base / "a").mkdir(parents=True)
    (base / "a" / "results.csv").write_text("benchmark\n")
    assert entry.argv(base, resume=True)[-3:] == ["--resume", "--out", str(base / "a")]
    assert "--resume" not in entry.argv(base)


@pytest.mark.parametrize(
    "text, message",
    [
        ('name = "s"\n', "no \\[\\[bench\\]\\] entries"),
        ('[[bench]]\ncommand = "train"\n', "needs command"),
        ('[[bench]]\ncommand = "matmul"\nout = "x"\n', "sets `out`"),
        ('[[bench]]\nname = "a"\ncommand = "matmul"\n[[bench]]\nname = "a"\ncommand = "matmul"\n', "unique"),
        ("[[bench]\n", "not valid TOML"),
    ],
)
def test_bad_suites_are_refused(tmp_path, text, message):
    suite = tmp_path / "bad.toml"
    suite.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_suite(suite)


# --- CLI errors ---


@pytest.mark.parametrize(
    "args, expected",
    [
        (["matmul", "--granularity", "colwise"], "tensorwise, axiswise, rowwise, blockwise, all"),
        (["matmul", "--fast-accum", "sometimes"], "on, off, both"),
        (["matmul", "--shape-gen", "cubes"], "square, pow2-extended, llama, training, sweep, dsv3, awkward, moe, tp-shards, unaligned, small-m, custom"),
        (["matmul", "--shape-gen", "custom", "--M", "64"], "needs --K, --N"),
        (["matmul", "--backend", "cutlass"], "cutlass"),
        (["matmul", "--timer", "stopwatch"], "auto, cuda-events, cupti"),
        (["run", "no/such/suite.toml"], "No such file"),
        (["run", str(Path(__file__).parents[1] / "suites" / "roofline.toml"), "--only", "roofline-2"],
         "no entry named roofline-2 in"),
    ],
)
def test_bad_options_are_usage_errors_listing_the_choices(args, expected):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert expected in " ".join(result.output.replace("│", " ").split()), result.output
    assert "Traceback" not in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where there is no GPU")
def test_no_gpu_is_one_clear_line(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["fp8bench", "matmul", "--shape-gen", "custom", "--M", "64", "--K", "64", "--N", "64"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "measures on a CUDA GPU and none is visible" in err and "Traceback" not in err


def test_report_can_share_one_plotly_between_runs(tmp_path):
    root = tmp_path / "reports"
    for name in ("run-a", "run-b"):
        with RunWriter(root / "gpu" / name, {"gpu_name": "test"}) as writer:
            row = _row("16x16x16", 1.0)
            row.values.update(granularity="tensorwise", backend="cublas", recipe="e4m3-tensorwise", fast_accum="on",
                              timer="fake", speedup_vs_bf16=1.5, tflops=10.0)
            writer.append(row)
        result = runner.invoke(app, ["report", str(root / "gpu" / name), "--shared-plotly", str(root)])
        assert result.exit_code == 0, result.output
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("plotly.min.js")) == ["plotly.min.js"]
    page = (root / "gpu" / "run-a" / "tensorwise.html").read_text()
    assert 'src="../../plotly.min.js"' in page
    outside = runner.invoke(app, ["report", str(root / "gpu" / "run-a"), "--shared-plotly", str(tmp_path / "elsewhere")])
    assert outside.exit_code == 2


def test_a_run_forcing_a_gemm_config_says_so_in_its_metadata(monkeypatch):
    from fp8bench.harness import env

    monkeypatch.delenv("FP8KERNELS_GEMM_CONFIG", raising=False)
    assert "gemm_config_override" not in env.run_metadata("fp8bench matmul")
    monkeypatch.setenv("FP8KERNELS_GEMM_CONFIG", '{"num_stages": 2}')
    assert env.run_metadata("fp8bench matmul")["gemm_config_override"] == '{"num_stages": 2}'


def test_a_tool_records_its_own_command_line_not_fp8benchs(monkeypatch):
    from fp8bench.harness import env

    monkeypatch.setattr("sys.argv", ["/checkout/tools/gemm_host_probe.py", "--out", "runs/host probe"])
    assert env.script_command_line() == "python tools/gemm_host_probe.py --out 'runs/host probe'"
    monkeypatch.setattr("sys.argv", ["tools/gemm_sweep.py"])
    assert env.script_command_line(without_arguments="compare") == "python tools/gemm_sweep.py compare"


def test_the_git_revision_named_by_the_environment_wins(monkeypatch):
    from fp8bench.harness import env

    monkeypatch.setenv("FP8BENCH_GIT_REV", "abc1234")
    assert env.git_revision() == "abc1234"  # a GPU host's copied tree may hold a stale .git
    monkeypatch.delenv("FP8BENCH_GIT_REV")
    assert env.git_revision() != "abc1234"


def test_one_clock_read_at_the_top_of_a_capped_swing_does_not_hide_the_cap():
    """A capped clock swings up to its maximum for part of each period: the settle reads it several times
    and any read under `throttled_below` of the maximum makes the case throttled."""
    from fp8bench.harness.timing import SETTLE_CLOCK_READS

    config = TimingConfig(repeats=2, settle_ms=40.0, warmup_ms=0.0, samples_ms=10.0, throttled_samples_ms=100.0)
    swinging = FakeTimer(base_ms=1.0, clock_mhz=1600.0, max_clock_mhz=1980.0)
    reads = iter([1980.0, 1500.0, 1980.0, 1980.0] + [1980.0] * 10)
    swinging.sm_clock_mhz = lambda: next(reads)
    assert measure(lambda: None, config, swinging).throttled
    steady = FakeTimer(base_ms=1.0, clock_mhz=1960.0, max_clock_mhz=1980.0)
    steady_reads: list[float] = []
    steady.sm_clock_mhz = lambda: steady_reads.append(1960.0) or 1960.0
    assert not measure(lambda: None, config, steady).throttled
    assert len(steady_reads) >= SETTLE_CLOCK_READS  # the settle's reads, then one a repeat


def load_clock_trace(monkeypatch):
    """tools/clock_trace.py as a module, pynvml stubbed (tracing needs it; reading a trace, or its cases, does not)."""
    import importlib.util
    import sys
    import types

    monkeypatch.setitem(sys.modules, "pynvml", types.ModuleType("pynvml"))
    spec = importlib.util.spec_from_file_location("clock_trace", Path(__file__).parents[1] / "tools/clock_trace.py")
    clock_trace = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(clock_trace)
    return clock_trace


def test_clock_trace_windows_spanning_the_swing_agree(tmp_path, monkeypatch):
    """tools/clock_trace.py --windows (how docs/timing.md sized TimingConfig.throttled_samples_ms):
    under a clock swinging with a 1 s period, 1 s windows agree and half-period windows do not."""
    clock_trace = load_clock_trace(monkeypatch)
    samples = tmp_path / "swing-samples.csv"
    times = [i / 1000 for i in range(4000)]
    samples.write_text("t_s,gpu_ms\n" + "".join(f"{t:.4f},{1 + 0.1 * math.sin(2 * math.pi * t):.5f}\n" for t in times))
    whole_period = clock_trace.consecutive_window_spreads(samples, 1.0)
    half_period = clock_trace.consecutive_window_spreads(samples, 0.5)
    assert len(whole_period) >= 10 and len(half_period) > len(whole_period)
    assert max(whole_period) < 0.5 < 5.0 < max(half_period)


def test_clock_trace_training_cases_pair_ours_with_cublas_unflushed(monkeypatch):
    """tools/clock_trace.py --cases training: ours and cuBLAS on each of the largest products of a LLaMa-3 8B
    training step, either first in turn, tensorwise with the recipe's accumulation, no L2 flush."""
    clock_trace = load_clock_trace(monkeypatch)
    cases = clock_trace.CASE_SETS["training"]()
    assert [c[0] for c in cases[:4]] == ["triton-tw-w13-output", "cublas-tw-w13-output", "cublas-tw-w13-grad_input", "triton-tw-w13-grad_input"]
    assert len(cases) == 8 and {c[2] for c in cases} == {"triton", "cublas"}
    assert all(c[3] is Granularity.TENSORWISE and c[5] is False for c in cases)
    assert [(c[1].M, c[1].K, c[1].N, c[4]) for c in cases[::2]] == [
        (8192, 4096, 28672, FastAccum.ON), (8192, 28672, 4096, FastAccum.OFF), (28672, 8192, 4096, FastAccum.OFF),
        (8192, 4096, 14336, FastAccum.OFF)]  # fmt: skip
    assert all(c[5] is True for c in clock_trace.CASE_SETS["clocks"]())


def test_the_command_line_imports_every_module_and_name_under_its_own_name():
    """Command functions are named so that what they import needs no alias (one name, one meaning)."""
    import ast

    import fp8bench.cli

    tree = ast.parse(Path(fp8bench.cli.__file__).read_text())
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert len(imports) > 50 and [f"{a.name} as {a.asname}" for node in imports for a in node.names if a.asname] == []
