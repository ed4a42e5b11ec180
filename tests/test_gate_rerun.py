"""The gate re-runs a flagged case of any benchmark from its identity (fp8bench.harness.runner.rerun with
the real cast and roofline benchmarks), on the CPU: our kernels under TRITON_INTERPRET=1, a fake clock that
knows which case it times (every row says timer `fake`; the runs live in a temporary folder)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from fp8bench.benchmarks import cast, layer  # noqa: E402
from fp8bench.config import GemmShape, TimingConfig  # noqa: E402
from fp8bench.gate import baseline as baselines  # noqa: E402
from fp8bench.gate import gate as gating  # noqa: E402
from fp8bench.gate.compare import ExitCode, Outcome  # noqa: E402
from fp8bench.harness.results import RunWriter, load_results  # noqa: E402
from fp8bench.harness.runner import rerun, run_cases  # noqa: E402
from fp8bench.harness.timing import Measurement  # noqa: E402
from fp8bench.model import roofline as model  # noqa: E402
from fp8bench.model.hardware import GPUS  # noqa: E402
from fp8bench.nn.recipes import RECIPES  # noqa: E402
from test_cast import exact_input  # noqa: E402

ON_GPU = torch.cuda.is_available()
H100 = "NVIDIA H100 80GB HBM3"
TIMING = TimingConfig(repeats=5)
SUITE = """
name = "reruns"
[[bench]]
name = "cast-small"
command = "cast"
shape-gen = "custom"
M = 128
K = 256
recipe = ["tensorwise", "blockwise-1x128"]
backend = ["triton", "torch"]
[[bench]]
name = "layer-small"
command = "roofline"
shape-gen = "custom"
M = 128
K = 128
N = 128
recipe = ["rowwise"]
implementation = ["triton"]
[gate]
metric = "time"
"""
CAST_CONFIG = cast.CastConfig((cast.CastShape(128, 256),), (cast.CAST_RECIPES["tensorwise"], cast.CAST_RECIPES["blockwise-1x128"]),
                              ("triton", "torch"), timing=TIMING)  # fmt: skip
LAYER_CONFIG = layer.LayerConfig((GemmShape(128, 128, 128),), (RECIPES["rowwise"],), ("triton",), timing=TIMING, eager=False,
                                 compile_backend="aot_eager")  # fmt: skip
CAST_FLAGGED = ("cast", "blockwise-1x128", "triton")
LAYER_FLAGGED = ("roofline", "rowwise", "triton-compile")


class CaseClock:
    """A made-up clock: a case's time follows its backend (1 ms, 0.5 ms for ours), times `slow` for the
    (benchmark, recipe, backend) keys in `slow`, with 1% lognormal noise per repeat."""

    def __init__(self, slow=(), seed: int = 0):
        self.slow, self.rng, self.current = set(slow), np.random.default_rng(seed), None
        self.timed: list[tuple[str, str, str]] = []

    def begin_group(self):
        pass

    def measure(self, fn, config):
        fn()
        key = self.current
        self.timed.append(key)
        ms = (0.5 if key[2].startswith("triton") else 1.0) * (1.3 if key in self.slow else 1.0)
        repeats = tuple(float(t) for t in ms * np.exp(self.rng.normal(0, 0.01, config.repeats)))
        return Measurement(repeats, 10, ms, "fake", ())

    def kernel_ms(self, fn, count):  # the layer's CUPTI breakdown
        return {"_fp8_gemm_persistent_kernel": 0.3}


@dataclass(frozen=True)
class TimedCase:
    """A real case that tells the clock which case it is timing."""

    case: object
    clock: CaseClock

    def __getattr__(self, name):
        return getattr(self.case, name)

    def build(self, inputs):
        identity = self.case.identity
        self.clock.current = (identity["benchmark"], identity["recipe"], identity["backend"])
        return self.case.build(inputs)


@dataclass
class Timed:
    """A real benchmark whose cases tell the clock what it times."""

    benchmark: object
    clock: CaseClock

    def __getattr__(self, name):
        return getattr(self.benchmark, name)

    def case_from_identity(self, identity):
        return TimedCase(self.benchmark.case_from_identity(identity), self.clock)

    def reference_of(self, case):
        return TimedCase(self.benchmark.reference_of(case.case), self.clock)


def _benchmark(entry: str, run_dir: Path, clock: CaseClock):
    if entry == "cast-small":
        return Timed(cast.CastBenchmark(CAST_CONFIG, "cpu"), clock)
    return Timed(layer.LayerBenchmark(LAYER_CONFIG, model.spec_ceilings(GPUS["h100-sxm"]), clock, run_dir, "cpu"), clock)


def _measure_tree(root: Path, slow=(), seed: int = 0) -> Path:
    """Both entries' runs, as `fp8bench run` would write them."""
    for entry in ("cast-small", "layer-small"):
        clock = CaseClock(slow, seed)
        benchmark = _benchmark(entry, root / entry, clock)
        with RunWriter(root / entry, {"gpu_name": H100, "benchmark": benchmark.name}) as writer:
            run_cases(benchmark, [TimedCase(c, clock) for c in benchmark.cases()], writer, clock, TIMING)
    return root


@pytest.fixture(autouse=True)
def exact_cast_inputs(monkeypatch):
    """Inputs our kernels quantize without rounding (the interpreter rounds fp8 differently from a GPU)."""
    monkeypatch.setattr(cast, "random_input", exact_input)


@pytest.mark.skipif(ON_GPU, reason="the fake-clock gate is the CPU stand-in")
def test_the_gate_reruns_a_flagged_cast_case_and_a_flagged_roofline_case_from_their_identity(tmp_path):
    suite = tmp_path / "reruns.toml"
    suite.write_text(SUITE)
    baselines.save(_measure_tree(tmp_path / "base"), "main", tmp_path / "baselines")
    new = _measure_tree(tmp_path / "new", slow={CAST_FLAGGED, LAYER_FLAGGED}, seed=1)  # slower once: a transient
    clocks: list[CaseClock] = []

    def remeasure(entry, case_id, run_dir):
        clock = CaseClock(seed=2 + len(clocks))
        clocks.append(clock)
        benchmark = _benchmark(entry.name, run_dir, clock)
        with RunWriter(run_dir, {"gpu_name": H100}) as writer:
            rerun([asdict(case_id)], writer, {benchmark.name: benchmark}, clock, TIMING)
        return run_dir

    config = gating.resolve_config(suite, None, None)
    comparison = gating.gate(suite, "main", tmp_path / "baselines", tmp_path / "out", config, None, lambda argv: None,
                             runs=new, remeasure=remeasure)  # fmt: skip
    flagged = {(c.case_id.benchmark, c.case_id.recipe, c.case_id.backend): c for c in comparison.cases if c.reruns}
    assert set(flagged) == {CAST_FLAGGED, LAYER_FLAGGED}
    # Each re-run measured the flagged case beside its group's reference, and nothing else.
    assert sorted(clock.timed[-1] for clock in clocks) == sorted(flagged)
    assert sorted(clock.timed[0][2] for clock in clocks) == ["bf16-compile", "torch"]
    for key, case in flagged.items():
        assert case.outcome is Outcome.INCONCLUSIVE and case.note == "the re-run alone stays within the threshold", key
    assert comparison.exit_code is ExitCode.PASS
    reruns = sorted((tmp_path / "out" / "_reruns").glob("*/*"))
    assert [p.parent.name for p in reruns] == ["cast-small", "layer-small"]
    for run in reruns:
        assert len(load_results(run)) == 2 and set(load_results(run)["status"]) == {"ok"}


def test_a_cast_run_compared_with_itself_matches_every_case(tmp_path):
    from fp8bench.gate.compare import Metric, run_samples

    clock = CaseClock()
    benchmark = Timed(cast.CastBenchmark(CAST_CONFIG, "cpu"), clock)
    with RunWriter(tmp_path, {"gpu_name": H100}) as writer:
        run_cases(benchmark, [TimedCase(c, clock) for c in benchmark.cases()], writer, clock, TIMING)
    frame = load_results(tmp_path)
    assert not frame[["benchmark", "case", "M", "K", "N", "granularity", "backend", "recipe", "fast_accum"]].isna().any().any()
    samples = run_samples(frame, Metric.TIME)
    assert len(samples.samples) == (frame["status"] == "ok").sum() == len(frame)


def test_a_rerun_measures_with_the_suite_entrys_own_settings(tmp_path, monkeypatch):
    """The CLI's re-run builds the entry's benchmark by the command's own option parsing (nothing runs)."""
    import fp8bench.cli as cli
    import fp8bench.harness.timing as timing
    from fp8bench.harness.suite import load_suite

    suite = tmp_path / "reruns.toml"
    suite.write_text(SUITE.replace("M = 128\nK = 256", "M = 128\nK = 256\ndtype = \"e5m2\"\nrepeats = 3"))
    monkeypatch.setattr(cli, "require_cuda", lambda command: H100)
    monkeypatch.setattr(timing, "TimerChoice", lambda choice, flush_l2: ("timer", choice))
    benchmark, clock, measured_with = cli._plan(load_suite(suite).entries[0], tmp_path / "_reruns" / "cast-small" / "case")
    assert isinstance(benchmark, cast.CastBenchmark) and clock == ("timer", "auto") and measured_with.repeats == 3
    assert benchmark.config.recipes == CAST_CONFIG.recipes and benchmark.config.fp8_dtype.value == "e5m2"
    assert benchmark.case_from_identity({"case": "128x256", "M": 128, "K": 256, "recipe": "tensorwise", "backend": "triton"}).recipe.name == "tensorwise"
    assert not (tmp_path / "_reruns").exists()  # planning writes nothing
    with pytest.raises(ValueError, match="no cast case has the backend 'cublas'"):
        benchmark.case_from_identity({"case": "128x256", "M": 128, "K": 256, "recipe": "tensorwise", "backend": "cublas"})
