"""The one run loop (fp8bench.harness.runner) on a fake benchmark and a fake clock: order, derived columns,
errors as rows, the bracketed reference, Ctrl-C, resume (atomic, also under SIGKILL) and out-folder safety."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from fp8bench.config import TimingConfig
from fp8bench.harness.case import Built, Failed, Peak, Unsupported, Work
from fp8bench.harness.results import COLUMNS, RESULTS_CSV, RunWriter, load_results, read_rows
from fp8bench.harness.runner import case_key, case_row, rerun, resume, run_cases
from fp8bench.harness.timing import Measurement
from fp8bench.harness.validate import MalformedFile

TIMING = TimingConfig(repeats=3)


@dataclass(frozen=True)
class FakeCase:
    group: str
    backend: str
    ms: float = 1.0
    fails: str = ""  # unsupported | wrong | oom | crash | wrapped | interrupt
    options: dict = field(default_factory=lambda: {"fixed": 1})

    @property
    def is_reference(self) -> bool:
        return self.backend == "ref"

    @property
    def identity(self) -> dict:
        return {"benchmark": "fake", "case": self.group, "M": 8, "K": 16, "N": 32, "granularity": "none" if self.is_reference else "tensorwise",
                "backend": self.backend, "recipe": "r", "fast_accum": "n/a"}  # fmt: skip

    @property
    def work(self) -> Work:
        return Work(flops=2e9, bytes=1e9, tokens=1e3)

    def build(self, inputs) -> Built:
        assert inputs == f"inputs of {self.group}"
        if self.fails == "unsupported":
            raise Unsupported("fake has no such thing")
        if self.fails == "oom":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        if self.fails == "wrapped":  # as torch.compile's BackendCompilerFailed words it
            raise RuntimeError("backend='inductor' raised:\nAssertionError: convert all Tensors to FakeTensors first\n\nWhile executing %x")
        if self.fails == "crash":
            raise RuntimeError("no kernel image\nsecond line")
        if self.fails == "interrupt":
            raise KeyboardInterrupt

        def check():
            if self.fails == "wrong":
                raise Failed("wrong result: fake", {"rel_err": 0.5})
            return {"rel_err": 0.01}

        return Built(lambda: self.ms, {"chosen": self.backend}, check)


@dataclass
class FakeBenchmark:
    name: str = "fake"
    speedup_vs_reference: bool = True
    bracket_reference: bool = False
    inputs_fail: frozenset = frozenset()
    allocated: list = field(default_factory=list)

    def inputs(self, group):
        self.allocated.append(group)
        if group in self.inputs_fail:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return f"inputs of {group}"

    def peak(self, case, reference):
        return Peak("tflops", 10.0)

    def case_from_identity(self, identity):
        return FakeCase(identity["case"], identity["backend"])

    def reference_of(self, case):
        return FakeCase(case.group, "ref")


class FakeClock:
    """Each case takes the time its `run` returns, times `factor` (a clock step: set it between calls)."""

    def __init__(self):
        self.factor = 1.0
        self.order: list[float] = []

    def begin_group(self):
        pass

    def measure(self, fn, config):
        ms = fn() * self.factor
        self.order.append(ms)
        return Measurement((ms, ms, ms), 10, ms * 1.2, "fake", ())


def _run(tmp_path, cases, benchmark=None, clock=None):
    benchmark = benchmark or FakeBenchmark()
    with RunWriter(tmp_path, {"command": "test"}) as writer:
        rows = run_cases(benchmark, cases, writer, clock or FakeClock(), TIMING)
    return rows, load_results(tmp_path)


def test_each_group_runs_its_reference_first_and_derives_every_column(tmp_path):
    cases = [FakeCase("a", "fp8", 0.5), FakeCase("a", "ref", 1.0), FakeCase("b", "ref", 2.0), FakeCase("b", "fp8", 0.8)]
    benchmark = FakeBenchmark()
    rows, frame = _run(tmp_path, cases, benchmark)
    assert benchmark.allocated == ["a", "b"]
    assert [(r.values["case"], r.values["backend"]) for r in rows] == [("a", "ref"), ("a", "fp8"), ("b", "ref"), ("b", "fp8")]
    fp8 = frame[(frame.case == "a") & (frame.backend == "fp8")].iloc[0]
    assert fp8.status == "ok" and fp8.median_ms == 0.5 and fp8.timer == "fake"
    assert fp8.tflops == pytest.approx(2e9 / 0.5e-3 / 1e12) and fp8.gbps == pytest.approx(1e9 / 0.5e-3 / 1e9)
    assert fp8.tokens_per_s == pytest.approx(1e3 / 0.5e-3) and fp8.pct_peak == pytest.approx(100 * fp8.tflops / 10.0)
    assert fp8.speedup_vs_bf16 == pytest.approx(2.0) and fp8.rel_err == 0.01
    assert json.loads(fp8.options) == {"fixed": 1, "chosen": "fp8"}
    assert math.isnan(frame[frame.backend == "ref"].iloc[0].speedup_vs_bf16)
    assert frame.loc[(frame.case == "b") & (frame.backend == "fp8"), "speedup_vs_bf16"].item() == pytest.approx(2.5)


def test_errors_become_rows_and_the_run_goes_on(tmp_path):
    cases = [FakeCase("a", "ref"), FakeCase("a", "u", fails="unsupported"), FakeCase("a", "w", 0.5, fails="wrong"),
             FakeCase("a", "o", fails="oom"), FakeCase("a", "c", fails="crash"), FakeCase("a", "x", fails="wrapped"), FakeCase("a", "ok", 0.5),
             FakeCase("big", "ref"), FakeCase("big", "fp8")]  # fmt: skip
    _, frame = _run(tmp_path, cases, FakeBenchmark(inputs_fail=frozenset({"big"})))
    status = dict(zip(frame.case + "/" + frame.backend, frame.status))
    assert status == {
        "a/ref": "ok", "a/u": "unsupported: fake has no such thing", "a/w": "failed: wrong result: fake",
        "a/o": "failed: out of memory", "a/c": "failed: RuntimeError: no kernel image", "a/ok": "ok",
        "a/x": "failed: RuntimeError: backend='inductor' raised: AssertionError: convert all Tensors to FakeTensors first",
        "big/ref": "failed: out of memory allocating the inputs", "big/fp8": "failed: out of memory allocating the inputs",
    }  # fmt: skip
    wrong = frame[frame.backend == "w"].iloc[0]  # a wrong result keeps what condemned it, and publishes no time
    assert wrong.rel_err == 0.5 and math.isnan(wrong.median_ms) and math.isnan(wrong.speedup_vs_bf16)
    assert json.loads(wrong.options) == {"fixed": 1, "chosen": "w"}
    assert json.loads(frame[frame.backend == "u"].iloc[0].options) == {"fixed": 1}


def test_ctrl_c_keeps_the_finished_rows(tmp_path):
    cases = [FakeCase("a", "ref"), FakeCase("a", "fp8"), FakeCase("b", "ref"), FakeCase("b", "fp8", fails="interrupt")]
    with RunWriter(tmp_path, {}) as writer, pytest.raises(KeyboardInterrupt):
        run_cases(FakeBenchmark(), cases, writer, FakeClock(), TIMING)
    assert list(load_results(tmp_path).backend) == ["ref", "fp8", "ref"]


class SteppingClock(FakeClock):
    """Every case after the first one of each group runs `step` slower: a clock step right after the reference."""

    def __init__(self, step: float):
        super().__init__()
        self.step = step

    def measure(self, fn, config):
        self.factor = 1.0 if len(self.order) == 0 else self.step
        return super().measure(fn, config)


def test_a_bracketed_reference_cancels_a_clock_step_after_it(tmp_path):
    cases = [FakeCase("a", "ref", 1.0), FakeCase("a", "fp8", 0.5)]
    _, frame = _run(tmp_path, cases, FakeBenchmark(bracket_reference=True), SteppingClock(1.03))
    ref, fp8 = frame.iloc[0], frame.iloc[1]
    assert (ref.reference_before_ms, ref.reference_after_ms) == (1.0, pytest.approx(1.03))
    assert fp8.reference_before_ms == 1.0 and fp8.reference_after_ms == pytest.approx(1.03)
    # Unbracketed the step would read 2 / 1.03 = 1.94; the geometric mean of before and after takes half of it.
    assert fp8.speedup_vs_bf16 == pytest.approx(math.sqrt(1.03) / 1.03 * 2.0)
    # The reference row is both measurements as one: what comparisons pair the FP8 repeats with.
    assert ref.median_ms == pytest.approx(math.sqrt(1.03)) and ref.repeat_ms == "1.01489;1.01489;1.01489"


def _write_partial_run(run_dir: Path) -> list[FakeCase]:
    cases = [FakeCase(g, b) for g in ("a", "b", "c") for b in ("ref", "fp8")]
    with RunWriter(run_dir, {}) as writer:
        run_cases(FakeBenchmark(), cases[:3], writer, FakeClock(), TIMING)  # a whole, b's reference only
        writer.append(case_row(FakeBenchmark(), FakeCase("z", "model"), "ok"))
    return cases


def test_resume_keeps_finished_groups_and_measures_the_rest(tmp_path):
    cases = _write_partial_run(tmp_path)
    left = resume(cases, tmp_path, keep=lambda row: row["backend"] == "model")
    assert [(c.group, c.backend) for c in left] == [("b", "ref"), ("b", "fp8"), ("c", "ref"), ("c", "fp8")]
    assert [(r["case"], r["backend"]) for r in read_rows(tmp_path)] == [("a", "ref"), ("a", "fp8"), ("z", "model")]
    with RunWriter(tmp_path, {}, resume=True) as writer:
        run_cases(FakeBenchmark(), left, writer, FakeClock(), TIMING)
    assert len(load_results(tmp_path)) == 7 and resume(cases, tmp_path) == []


@pytest.mark.parametrize("cut", ["inside the last field", "fields short"])
def test_resume_measures_again_a_row_torn_by_a_kill_mid_append(tmp_path, cut):
    """A kill while a row is appended leaves its line without a newline: cut inside its last field (the
    bracketed reference_after_ms: as many fields as the header, a wrong number) or fields short."""
    cases = [FakeCase(g, b) for g in ("a", "b") for b in ("ref", "fp8")]
    _run(tmp_path, cases, FakeBenchmark(bracket_reference=True))
    csv_path = tmp_path / RESULTS_CSV
    whole = csv_path.read_bytes()
    torn = whole[: -len(b"3\r\n")] if cut == "inside the last field" else whole[: whole.rindex(b",fake,") + 40]
    csv_path.write_bytes(torn)
    with pytest.raises(MalformedFile, match=r"line 5 is torn \(no newline\)"):  # read outside a resume, a torn file is an error
        load_results(tmp_path)
    left = resume(cases, tmp_path)
    assert [(c.group, c.backend) for c in left] == [("b", "ref"), ("b", "fp8")]  # the torn row's whole group
    assert [(r["case"], r["backend"]) for r in read_rows(tmp_path)] == [("a", "ref"), ("a", "fp8")]
    assert csv_path.read_bytes() == whole[: whole.index(b"\r\nfake,b,") + 2]  # the finished rows as written
    with RunWriter(tmp_path, {}, resume=True) as writer:
        run_cases(FakeBenchmark(bracket_reference=True), left, writer, FakeClock(), TIMING)
    assert csv_path.read_bytes() == whole and list(load_results(tmp_path)["reference_after_ms"]) == [1.0] * 4


def test_a_resumed_writer_drops_a_torn_last_line_before_it_appends(tmp_path):
    """The ranks of a torchrun launch and any caller that did not rewrite the run first: no row is glued onto a torn one."""
    cases = [FakeCase("a", "ref"), FakeCase("a", "fp8")]
    _run(tmp_path, cases)
    csv_path = tmp_path / RESULTS_CSV
    whole = csv_path.read_bytes()
    csv_path.write_bytes(whole[:-7])
    with RunWriter(tmp_path, {}, resume=True) as writer:
        writer.append(case_row(FakeBenchmark(), FakeCase("a", "fp8"), "ok"))
    assert [(r["case"], r["backend"]) for r in read_rows(tmp_path)] == [("a", "ref"), ("a", "fp8")]
    csv_path.write_bytes(b"benchmark,ca")  # killed while writing the header: nothing finished, the run starts afresh
    assert read_rows(tmp_path) == []
    RunWriter(tmp_path, {}, resume=True).close()
    assert csv_path.read_text().splitlines() == [",".join(COLUMNS)]


def test_a_short_row_inside_a_run_is_refused_not_resumed_over(tmp_path):
    _run(tmp_path, [FakeCase("a", "ref"), FakeCase("a", "fp8")])
    csv_path = tmp_path / RESULTS_CSV
    lines = csv_path.read_bytes().split(b"\r\n")
    lines[1] = lines[1][:30]
    csv_path.write_bytes(b"\r\n".join(lines))
    with pytest.raises(MalformedFile, match=r"results.csv: line 2 has \d+ fields"):
        resume([FakeCase("a", "ref")], tmp_path)


def test_an_out_folder_holding_another_run_is_refused_unless_resumed(tmp_path):
    _write_partial_run(tmp_path)
    with pytest.raises(ValueError, match="holds another run.*--resume"):
        RunWriter(tmp_path, {"command": "second"})
    assert json.loads((tmp_path / "metadata.json").read_text()) == {}  # the first run's metadata stays
    RunWriter(tmp_path, {}, resume=True).close()


def test_rerun_measures_the_named_cases_beside_their_reference(tmp_path):
    identities = [FakeCase("a", "fp8").identity, FakeCase("a", "other").identity, FakeCase("b", "ref").identity]
    with RunWriter(tmp_path, {}) as writer:
        rows = rerun(identities, writer, {"fake": FakeBenchmark()}, FakeClock(), TIMING)
    assert [(r.values["case"], r.values["backend"]) for r in rows] == [("a", "ref"), ("a", "fp8"), ("a", "other"), ("b", "ref")]
    with RunWriter(tmp_path / "x", {}) as writer, pytest.raises(ValueError, match="cannot re-run matmul"):
        rerun([{**identities[0], "benchmark": "matmul"}], writer, {"fake": FakeBenchmark()}, FakeClock(), TIMING)


KILLED_REWRITE = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from fp8bench.harness import results

    real_fsync = os.fsync
    def stall(fd):  # the new file is written: die before the rename, as a SIGKILL at that moment would
        real_fsync(fd)
        print("written", flush=True)
        sys.stdin.readline()
    os.fsync = stall
    results.keep_rows(Path(sys.argv[1]), lambda row: row["case"] != "b")
    """
)


def test_a_resume_killed_in_its_rewrite_loses_no_finished_row(tmp_path):
    rows = 20_000  # a large file: its rewrite takes a while
    with RunWriter(tmp_path, {}) as writer:
        for i in range(rows):
            writer.append(case_row(FakeBenchmark(), FakeCase(f"g{i}", "ref"), "ok"))
    before = (tmp_path / RESULTS_CSV).read_bytes()
    child = subprocess.Popen([sys.executable, "-c", KILLED_REWRITE, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout.readline().strip() == b"written"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    assert (tmp_path / RESULTS_CSV).read_bytes() == before and len(read_rows(tmp_path)) == rows


def test_case_keys_match_between_cases_and_csv_rows(tmp_path):
    case = FakeCase("a", "fp8")
    _run(tmp_path, [case])
    assert case_key(read_rows(tmp_path)[0]) == case_key(case.identity)


def test_the_cli_refuses_an_out_folder_holding_another_run_and_resumes_one(tmp_path, monkeypatch):
    """`fp8bench cast` (a stand-in clock: the GPU check and the timer are bypassed, nothing runs on a GPU):
    a second run into the same --out is exit 2 with a one-line reason, its first run untouched."""
    from typer.testing import CliRunner

    import fp8bench.cli as cli
    import fp8bench.harness.runner as runner
    import fp8bench.harness.timing as timing

    monkeypatch.setattr(cli, "require_cuda", lambda command: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(timing, "TimerChoice", lambda choice, flush_l2: FakeClock())
    ran: list[int] = []
    monkeypatch.setattr(runner, "run_cases", lambda benchmark, cases, *args, **kwargs: ran.append(len(cases)) or [])
    args = ["cast", "--shape-gen", "custom", "--M", "128", "--K", "256", "--recipe", "tensorwise", "--no-report", "--out", str(tmp_path)]
    first = CliRunner().invoke(cli.app, args)
    assert first.exit_code == 0, first.output
    with RunWriter(tmp_path, {"command": "first"}, resume=True) as writer:  # the first run's copy row
        writer.append(case_row(FakeBenchmark(), FakeCase("x", "ref"), "ok"))
    with (tmp_path / RESULTS_CSV).open("a") as csv_file:  # and a row torn by a kill mid-append
        csv_file.write("fake,y,8,16,32,none,re")
    second = CliRunner().invoke(cli.app, args, env={"COLUMNS": "300"})
    assert second.exit_code == 2 and "holds another run (results.csv); give a new --out, or --resume" in second.output
    assert len(read_rows(tmp_path)) == 1 and ran == [5]  # the copy, then tensorwise by 4 backends
    resumed = CliRunner().invoke(cli.app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert ran == [5, 5] and "resuming" in resumed.output  # none of the cast's cases is in the first run's rows
    assert (tmp_path / RESULTS_CSV).read_text().endswith("\n") and len(read_rows(tmp_path)) == 0  # the fake rows: no case of the cast


def test_resume_refuses_a_run_begun_on_another_gpu_model_and_leaves_it_untouched(tmp_path, monkeypatch):
    """Rows carry no GPU name: `--resume` on another card would pass its rows for the first card's. Refused, exit
    2 with both names, before the run's CSV (here with a torn last row, which a resume would trim) is touched."""
    from typer.testing import CliRunner

    import fp8bench.cli as cli
    import fp8bench.harness.env as env
    import fp8bench.harness.timing as timing

    monkeypatch.setattr(cli, "require_cuda", lambda command: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(env, "cuda_device_name", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(timing, "TimerChoice", lambda choice, flush_l2: FakeClock())
    with RunWriter(tmp_path, {"command": "first", "gpu_name": "NVIDIA H200"}) as writer:
        writer.append(case_row(FakeBenchmark(), FakeCase("x", "ref"), "ok"))
    with (tmp_path / RESULTS_CSV).open("a") as csv_file:
        csv_file.write("fake,y,8,16,32,none,re")
    before = (tmp_path / RESULTS_CSV).read_text()
    args = ["cast", "--shape-gen", "custom", "--M", "128", "--K", "256", "--recipe", "tensorwise", "--no-report",
            "--out", str(tmp_path), "--resume"]
    refused = CliRunner().invoke(cli.app, args, env={"COLUMNS": "300"})
    assert refused.exit_code == 2
    assert "was measured on NVIDIA H200 and this is NVIDIA H100 80GB HBM3" in " ".join(refused.output.split())
    assert (tmp_path / RESULTS_CSV).read_text() == before
    assert json.loads((tmp_path / "metadata.json").read_text())["gpu_name"] == "NVIDIA H200"


def test_a_matmul_run_with_the_tuned_backend_keeps_its_problems_tuned_configs(tmp_path, monkeypatch):
    """`fp8bench matmul --backend triton-tuned` (stand-in clock and runner: nothing runs on a GPU) copies the tuner's
    entries for its products into the run folder, and only those; a run without that backend copies none."""
    import torch
    from typer.testing import CliRunner

    import fp8bench.cli as cli
    import fp8bench.harness.runner as runner
    import fp8bench.harness.timing as timing
    from fp8bench.harness.results import TUNE_CACHE_JSON
    from fp8kernels.gemm_autotune import CACHE_ENV, TuneCache, cache_path, problem_key
    from fp8kernels.gemm_configs import Fp8GemmConfig
    from fp8kernels.scaling import Granularity as KernelGranularity

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(cli, "require_cuda", lambda command: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(timing, "TimerChoice", lambda choice, flush_l2: FakeClock())
    monkeypatch.setattr(runner, "run_cases", lambda benchmark, cases, *args, **kwargs: [])
    config = Fp8GemmConfig(block_m=128, block_n=128, block_k=128, group_m=8, num_stages=4, num_warps=8, num_sms=132)
    cache = TuneCache(cache_path("NVIDIA H100 80GB HBM3"))
    for M in (256, 512):
        cache.store(problem_key(M, 1024, 2048, KernelGranularity.TENSORWISE, True, 128, torch.float8_e4m3fn,
                                torch.float8_e4m3fn), config, {"128x128x128 s4 w8 g8 gluon-ws": 0.01})
    args = ["matmul", "--shape-gen", "custom", "--M", "256", "--K", "2048", "--N", "1024", "--no-report"]
    tuned = CliRunner().invoke(cli.app, [*args, "--backend", "triton-tuned", "--out", str(tmp_path / "tuned")])
    assert tuned.exit_code == 0, tuned.output
    assert [key.split("/")[0] for key in TuneCache(tmp_path / "tuned" / TUNE_CACHE_JSON).read()] == ["256x1024x2048"]
    plain = CliRunner().invoke(cli.app, [*args, "--backend", "triton", "--out", str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.output
    assert not (tmp_path / "plain" / TUNE_CACHE_JSON).exists()
    cache.path.write_text("{not json")  # a malformed cache: a line naming it, the run's exit unchanged
    broken = CliRunner().invoke(cli.app, [*args, "--backend", "triton-tuned", "--out", str(tmp_path / "broken")])
    assert broken.exit_code == 0 and "tuned configs not kept" in broken.output and cache.path.name in broken.output


def test_a_benchmark_with_only_the_required_parts_runs(tmp_path):
    """Options, peak, speedup_vs_reference and bracket_reference are optional (case.py lists the defaults)."""

    @dataclass(frozen=True)
    class BareCase:
        backend: str
        identity: dict = field(default_factory=dict)
        work: Work = Work(tokens=10.0)
        group: str = "g"

        @property
        def is_reference(self):
            return self.backend == "ref"

        def build(self, inputs):
            return Built(lambda: 1.0 if self.is_reference else 0.25)

    class Bare:
        name = "bare"

        def inputs(self, group):
            return None

    cases = [BareCase(b, {"case": "g", "backend": b}) for b in ("ref", "fp8")]
    _, frame = _run(tmp_path, cases, Bare())
    fp8 = frame[frame.backend == "fp8"].iloc[0]
    assert fp8.speedup_vs_bf16 == 4.0 and fp8.tokens_per_s == pytest.approx(10 / 0.25e-3) and math.isnan(fp8.pct_peak)
    assert fp8.options == "{}" and math.isnan(frame.iloc[0].reference_after_ms)


def test_every_command_refuses_resume_without_out_before_it_runs_anything():
    """Each command that can continue a run folder: `--resume` alone is a usage error (exit 2) naming --out,
    on this CPU-only machine too (nothing is checked or started first). `run` is left out: its suite names
    the folders."""
    import typer.main
    from typer.testing import CliRunner

    import fp8bench.cli as cli

    commands = typer.main.get_command(cli.app).commands
    resumable = sorted(name for name, command in commands.items() if "resume" in {p.name for p in command.params} and name != "run")
    assert resumable == ["cast", "e2e", "matmul", "roofline"]
    for name in resumable:
        result = CliRunner().invoke(cli.app, [name, "--resume"], env={"COLUMNS": "300"})
        assert result.exit_code == 2 and "--resume continues a run: give its folder with --out" in result.output, (name, result.output)
