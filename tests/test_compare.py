"""compare / gate / baseline: the statistics (a seeded simulation), the suite's [gate] table, the exit
codes of the CLI, the outputs, baselines keyed by GPU model, and the gate's re-runs. CPU only: runs
are synthetic folders written through RunWriter."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from fp8bench.gate import baseline as baselines
from fp8bench.gate import gate as gating
from fp8bench.cli import app
from fp8bench.gate.compare import (
    DEFAULT_GATES,
    CaseId,
    EnvironmentPolicy,
    ExitCode,
    GateConfig,
    Metric,
    Outcome,
    Thresholds,
    judge,
    geomean,
    judge_rerun,
    needs_rerun,
    run_samples,
)
from fp8bench.gate.output import junit, markdown, to_json
from fp8bench.harness.results import Row, RunWriter, format_repeat_times, load_results
from fp8bench.harness.suite import load_suite
from fp8bench.harness.validate import MalformedFile

REPO = Path(__file__).resolve().parent.parent
H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"
runner = CliRunner()

# ---- the seeded simulation -----------------------------------------------------------------------

TRIALS = 4000
REPEATS = 5
SIGMA = 0.02  # lognormal noise per repeat


def _simulate(shift: float, thresholds: Thresholds, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Outcome codes of TRIALS comparisons: the first decision, and the final one after the gate's
    one re-run of flagged cases (a fresh set of REPEATS repeats)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(0.0, SIGMA, (TRIALS, REPEATS))
    new = rng.normal(shift, SIGMA, (TRIALS, REPEATS))
    fresh = rng.normal(shift, SIGMA, (TRIALS, REPEATS))
    first = judge(base, new, thresholds)
    second, _ = judge_rerun(base, new, fresh, thresholds)
    flagged = first.is_(Outcome.REGRESSION) | first.is_(Outcome.INCONCLUSIVE)
    assert flagged.tolist() == [needs_rerun(o) for o in (_outcome(code) for code in first.codes)]
    return first, replace(second, codes=np.where(flagged, second.codes, first.codes))


def _outcome(code: int) -> Outcome:
    return list(Outcome)[code]


def _rate(judgement, outcome: Outcome) -> float:
    return float(np.mean(judgement.is_(outcome)))


def test_simulation_false_fail_rate_with_no_change_is_at_most_one_percent():
    first, final = _simulate(0.0, DEFAULT_GATES[Metric.SPEEDUP].thresholds, seed=1)
    assert _rate(first, Outcome.REGRESSION) <= 0.01
    assert _rate(final, Outcome.REGRESSION) <= 0.01


def test_simulation_detects_an_eight_percent_slowdown_at_least_ninety_percent_of_the_time():
    first, final = _simulate(math.log(1.08), DEFAULT_GATES[Metric.SPEEDUP].thresholds, seed=2)
    assert _rate(first, Outcome.REGRESSION) >= 0.90
    assert _rate(final, Outcome.REGRESSION) >= 0.90


def test_simulation_detects_an_eight_percent_speedup_as_improvement():
    first, _ = _simulate(math.log(1 / 1.08), DEFAULT_GATES[Metric.SPEEDUP].thresholds, seed=3)
    assert _rate(first, Outcome.IMPROVEMENT) >= 0.90
    assert _rate(first, Outcome.REGRESSION) == 0


def test_simulation_welch_test_alone_fails_about_alpha_of_unchanged_cases():
    """With no floor and no k*sigma, only the t-test decides: its false-fail rate must be near alpha,
    which shows the p-values are calibrated (pairing-free, one-sided, right degrees of freedom)."""
    first, _ = _simulate(0.0, Thresholds(floor_pct=0.0, k_sigma=0.0, alpha=0.05), seed=4)
    assert 0.035 <= _rate(first, Outcome.REGRESSION) <= 0.065


# A clock step right after a group's BF16 reference: every later kernel of the group runs 3% slower. The
# harness measures the reference again after the group (fp8bench.harness.runner) and pairs each FP8 repeat
# with the geometric mean of the two reference repeats (fp8bench.harness.timing.bracketed): half the step
# stays in the speedups. Simulated on suites of SUITE_CASES cases, the unit a gate decides, geomean included.
STEP = math.log(1.03)
SUITE_CASES = 20
SUITE_TRIALS = 1000


def _suite_run(rng, step: float, shift: float, bracketed: bool) -> np.ndarray:
    """Per-repeat log speedup costs of SUITE_TRIALS suites (trials x cases x repeats)."""
    shape = (SUITE_TRIALS, SUITE_CASES, REPEATS)
    before = rng.normal(0.0, SIGMA, shape)
    fp8 = rng.normal(shift, SIGMA, shape) + step
    after = rng.normal(0.0, SIGMA, shape) + step
    return fp8 - ((before + after) / 2 if bracketed else before)


def _suite_regressions(shift: float, bracketed: bool, seed: int, rerun_step: float = 0.0) -> tuple[float, float]:
    """Shares of suites that `compare` and `gate` (one re-run of flagged cases) fail: a case or the geomean
    a REGRESSION. The baseline ran without the step, the new run with it, its re-runs with `rerun_step`."""
    rng = np.random.default_rng(seed)
    base = _suite_run(rng, 0.0, 0.0, bracketed)
    new = _suite_run(rng, STEP, shift, bracketed)
    fresh = _suite_run(rng, rerun_step, shift, bracketed)
    gate = DEFAULT_GATES[Metric.SPEEDUP]
    flat = lambda a: a.reshape(-1, REPEATS)  # noqa: E731
    first = judge(flat(base), flat(new), gate.thresholds)
    second, _ = judge_rerun(flat(base), flat(new), flat(fresh), gate.thresholds)
    flagged = first.is_(Outcome.REGRESSION) | first.is_(Outcome.INCONCLUSIVE)
    final = np.where(flagged, second.codes, first.codes).reshape(SUITE_TRIALS, SUITE_CASES)
    merged = np.where(flagged.reshape(SUITE_TRIALS, SUITE_CASES, 1), (new + fresh) / 2, new)
    regression = list(Outcome).index(Outcome.REGRESSION)

    def failed(codes: np.ndarray, newest: np.ndarray) -> np.ndarray:
        slowdowns = np.expm1(newest.mean(axis=-1) - base.mean(axis=-1)) * 100
        suites = [geomean([SimpleNamespace(slowdown_pct=s) for s in row], gate, gate.thresholds.alpha) for row in slowdowns]
        return (codes == regression).any(axis=1) | np.array([g.outcome is Outcome.REGRESSION for g in suites])

    return float(failed(first.codes.reshape(SUITE_TRIALS, SUITE_CASES), new).mean()), float(failed(final, merged).mean())


def test_simulation_a_clock_step_after_the_bracketed_reference_does_not_fail_unchanged_suites():
    """A step in the run only (re-runs are fresh groups): the gate keeps its promise with the bracket and
    breaks it without. `compare` alone, with no re-run, still fails some suites (half the step stays)."""
    compare_fails, gate_fails = _suite_regressions(0.0, bracketed=True, seed=6)
    assert gate_fails <= 0.01 and compare_fails <= 0.2
    unbracketed_compare, unbracketed_gate = _suite_regressions(0.0, bracketed=False, seed=6)
    assert unbracketed_gate > 0.2 and unbracketed_compare > 0.8


def test_simulation_a_step_after_every_reference_is_only_halved_by_the_bracket():
    """A step that recurs in every group, re-runs included: the bracket halves it, so a few suites still
    fail (where the recorded reference_before_ms / reference_after_ms show it)."""
    _, gate_fails = _suite_regressions(0.0, bracketed=True, seed=6, rerun_step=STEP)
    _, unbracketed = _suite_regressions(0.0, bracketed=False, seed=6, rerun_step=STEP)
    assert gate_fails <= 0.05 < 0.5 < unbracketed


def test_simulation_a_clock_step_after_the_bracketed_reference_still_lets_an_eight_percent_slowdown_fail():
    compare_fails, gate_fails = _suite_regressions(math.log(1.08), bracketed=True, seed=7)
    assert compare_fails >= 0.90 and gate_fails >= 0.90


def test_judge_a_single_case_matches_the_batched_decision():
    rng = np.random.default_rng(5)
    base, new = rng.normal(0, SIGMA, (3, REPEATS)), rng.normal(0.1, SIGMA, (3, REPEATS))
    batch = judge(base, new, Thresholds())
    for i in range(3):
        one = judge(base[i], new[i], Thresholds())
        assert one.outcome() is _outcome(batch.codes[i])
        assert float(one.p_slower) == pytest.approx(float(batch.p_slower[i]))


def test_judge_needs_two_repeats_a_side():
    with pytest.raises(ValueError, match="2 repeats"):
        judge(np.zeros(1), np.zeros(5), Thresholds())


# ---- synthetic runs ------------------------------------------------------------------------------

SHAPES = ((2048, 2048, 2048), (4096, 4096, 4096), (8192, 4096, 6144))
FP8_CASES = (("tensorwise", "cublas", "on"), ("axiswise", "cublas", "off"), ("blockwise", "cublas", "off"))


def _row(M, K, N, granularity, backend, fast_accum, times=None, status="ok", case=None, timer="") -> Row:
    values = dict(
        benchmark="matmul", case=case or f"{M}x{K}x{N}", M=M, K=K, N=N, granularity=granularity, backend=backend,
        recipe="bf16" if granularity == "none" else f"e4m3-{granularity}", fast_accum=fast_accum, options="{}",
        status=status, timer=timer,
    )
    if times is not None:
        values.update(repeats=len(times), repeat_ms=format_repeat_times(times), median_ms=float(np.median(times)))
    return Row(values)


def write_run(
    path: Path,
    seed: int,
    gpu: str | None = H100,
    slowdown: dict[tuple[str, str, str], float] | None = None,
    noise: float = SIGMA,
    shapes=SHAPES,
    cases=FP8_CASES,
    extra_rows=(),
    timer: str = "cuda-events",
    metadata: dict | None = None,
    case_names: dict[tuple[int, int, int], str] | None = None,
) -> Path:
    """A matmul run: each shape's BF16 reference and FP8 cases (FP8 about 1.8x faster), lognormal noise
    per repeat, and `slowdown` multiplying the FP8 times of the named (granularity, backend, accum)."""
    rng = np.random.default_rng(seed)
    metadata = {**({"gpu_name": gpu, "gpu_spec": "h100-sxm"} if gpu else {}), **(metadata or {})}
    with RunWriter(path, metadata) as writer:
        for M, K, N in shapes:
            bf16_ms = 2 * M * K * N / 700e12 * 1e3
            name = (case_names or {}).get((M, K, N))
            writer.append(_row(M, K, N, "none", "bf16", "n/a", bf16_ms * np.exp(rng.normal(0, noise, REPEATS)), case=name, timer=timer))
            for key in cases:
                factor = (slowdown or {}).get(key, 1.0)
                times = bf16_ms / 1.8 * factor * np.exp(rng.normal(0, noise, REPEATS))
                writer.append(_row(M, K, N, *key, times, case=name, timer=timer))
        for row in extra_rows:
            writer.append(row)
    return path


def cli(*args: str):
    return runner.invoke(app, [str(a) for a in args])


# ---- samples from runs ---------------------------------------------------------------------------


def test_speedup_samples_pair_repeat_i_of_the_fp8_case_with_repeat_i_of_its_bf16_reference(tmp_path):
    bf16, fp8 = [1.0, 1.1, 0.9, 1.05], [0.5, 0.6, 0.52, 0.55]
    with RunWriter(tmp_path, {"gpu_name": H100}) as writer:
        writer.append(_row(256, 256, 256, "none", "bf16", "n/a", bf16))
        writer.append(_row(256, 256, 256, "tensorwise", "cublas", "on", fp8))
    samples = run_samples(load_results(tmp_path), Metric.SPEEDUP)
    (case_id, values), = samples.samples.items()
    assert case_id.granularity == "tensorwise"
    np.testing.assert_allclose(values, np.log(np.array(fp8) / np.array(bf16)), rtol=1e-5)
    times = run_samples(load_results(tmp_path), Metric.TIME)
    assert len(times.samples) == 2  # the BF16 reference is a case of its own for absolute times
    np.testing.assert_allclose(times.samples[case_id], np.log(fp8), rtol=1e-5)


def test_rows_that_are_not_ok_or_lack_a_reference_are_reported_not_compared(tmp_path):
    with RunWriter(tmp_path, {"gpu_name": H100}) as writer:
        writer.append(_row(256, 256, 256, "none", "bf16", "n/a", status="failed: out of memory"))
        writer.append(_row(256, 256, 256, "tensorwise", "cublas", "on", [0.5, 0.6, 0.55]))
        writer.append(_row(512, 512, 512, "none", "bf16", "n/a", [1.0, 1.1, 1.05]))
        writer.append(_row(512, 512, 512, "blockwise", "cublas", "on", status="unsupported: no fast accumulation"))
        writer.append(_row(1024, 512, 512, "axiswise", "cublas", "on", [0.3, 0.31, 0.32]))
    samples = run_samples(load_results(tmp_path), Metric.SPEEDUP)
    assert not samples.samples
    reasons = sorted(samples.problems.values())
    assert reasons == [
        "BF16 reference: failed: out of memory",
        "no BF16 reference row for this shape in the run",
        "unsupported: no fast accumulation",
    ]


def test_a_case_measured_twice_in_one_run_is_a_malformed_file_naming_both_lines(tmp_path):
    with RunWriter(tmp_path, {"gpu_name": H100}) as writer:
        writer.append(_row(512, 512, 512, "none", "bf16", "n/a", [1.0, 1.1, 1.05]))
        for _ in range(2):
            writer.append(_row(512, 512, 512, "axiswise", "cublas", "on", [0.5, 0.52, 0.51]))
    with pytest.raises(MalformedFile, match=r"results.csv: lines 3 and 4 hold the same case matmul/512x512x512/axiswise"):
        run_samples(load_results(tmp_path), Metric.SPEEDUP)


# ---- the [gate] table ----------------------------------------------------------------------------


@pytest.mark.parametrize("suite", ["ci.toml", "ci-quick.toml"])
def test_ci_suites_let_no_broken_run_pass(suite):
    """Every baseline case matched, INCONCLUSIVE failing, a timer or library change refused."""
    config = GateConfig.from_table(load_suite(REPO / "suites" / suite).raw["gate"])
    assert config.fail_on_inconclusive is True and config.min_matched_pct == 100
    assert config.environment_change is EnvironmentPolicy.REFUSE


def test_ci_suite_gate_table_parses_with_an_override_for_the_small_shape():
    config = GateConfig.from_table(load_suite(REPO / "suites" / "ci.toml").raw["gate"])
    assert config.metric is Metric.SPEEDUP
    small = CaseId("matmul", "2048x2048x2048", 2048, 2048, 2048, "axiswise", "triton", "e4m3-axiswise", "on")
    large = CaseId("matmul", "8192x8192x8192", 8192, 8192, 8192, "axiswise", "triton", "e4m3-axiswise", "on")
    assert config.speedup.thresholds_for(small.label).floor_pct == 8
    assert config.speedup.thresholds_for(large.label) == config.speedup.thresholds
    assert config.time.thresholds.floor_pct > config.speedup.thresholds.floor_pct


def test_overrides_apply_in_file_order_and_only_the_keys_they_set():
    config = GateConfig.from_table(
        {
            "floor_pct": 4,
            "override": [
                {"match": "matmul/*/blockwise/*", "floor_pct": 8, "k_sigma": 1},
                {"match": "matmul/*/blockwise/triton/*", "floor_pct": 12},
            ],
        }
    )
    triton = config.speedup.thresholds_for("matmul/4096x4096x4096/blockwise/triton/e4m3-blockwise/accum-off")
    cublas = config.speedup.thresholds_for("matmul/4096x4096x4096/blockwise/cublas/e4m3-blockwise/accum-off")
    other = config.speedup.thresholds_for("matmul/4096x4096x4096/tensorwise/triton/e4m3-tensorwise/accum-on")
    assert (triton.floor_pct, triton.k_sigma) == (12, 1)
    assert (cublas.floor_pct, cublas.k_sigma) == (8, 1)
    assert (other.floor_pct, other.k_sigma, other.alpha) == (4, 2.0, 0.01)


@pytest.mark.parametrize(
    "table, message",
    [
        ({"floor": 5}, r"\[gate\]: unknown key"),
        ({"metric": "tflops"}, "metric must be one of"),
        ({"alpha": 0}, "alpha"),
        ({"floor_pct": -1}, "floor_pct"),
        ({"k_sigma": True}, "k_sigma"),
        ({"fail_on_inconclusive": "yes"}, "fail_on_inconclusive"),
        ({"override": [{"floor_pct": 8}]}, "needs `match`"),
        ({"override": [{"match": "matmul/*"}]}, "sets no threshold"),
        ({"override": [{"match": "matmul/*", "alpha": 2}]}, "alpha"),
        ({"time": {"floor_pct": "ten"}}, r"\[gate.time\]"),
    ],
)
def test_bad_gate_tables_raise_a_clear_error(table, message):
    with pytest.raises(ValueError, match=message):
        GateConfig.from_table(table)


# ---- compare: exit codes and outputs ------------------------------------------------------------


def test_compare_passes_an_unchanged_run(tmp_path):
    base, new = write_run(tmp_path / "base", 1), write_run(tmp_path / "new", 2)
    result = cli("compare", base, new)
    assert result.exit_code == ExitCode.PASS, result.output
    assert "PASS (exit 0)" in result.output


def test_compare_fails_a_regression_and_writes_markdown_json_and_junit(tmp_path):
    base = write_run(tmp_path / "base", 1)
    new = write_run(tmp_path / "new", 2, slowdown={("blockwise", "cublas", "off"): 1.15})
    md, js, xml = tmp_path / "gate.md", tmp_path / "gate.json", tmp_path / "gate.xml"
    result = cli("compare", base, new, "--markdown", md, "--json", js, "--junit", xml)
    assert result.exit_code == ExitCode.REGRESSION, result.output

    report = json.loads(js.read_text())
    assert report["verdict"] == "REGRESSION" and report["exit_code"] == 1
    regressed = [c for c in report["cases"] if c["outcome"] == "REGRESSION"]
    assert {c["case_id"]["granularity"] for c in regressed} == {"blockwise"}
    assert len(regressed) == len(SHAPES)
    assert all(10 < c["slowdown_pct"] < 20 and c["p_value"] < 0.01 for c in regressed)
    assert report["counts"]["REGRESSION"] == len(SHAPES)

    text = md.read_text()
    assert text.startswith("## fp8bench gate: REGRESSION")
    assert "### Cases that are not PASS" in text
    assert sum("| REGRESSION |" in line for line in text.splitlines()) == 2 * len(SHAPES)  # flagged table + all

    root = ET.parse(xml).getroot()
    assert root.tag == "testsuites"
    assert int(root.get("failures")) == len(SHAPES)
    failures = root.findall(".//testcase/failure")
    assert all(f.get("type") == "REGRESSION" for f in failures)
    assert int(root.get("tests")) == len(SHAPES) * len(FP8_CASES) + 2  # + the coverage and the geomean


def test_compare_calls_a_faster_run_an_improvement_and_passes(tmp_path):
    base = write_run(tmp_path / "base", 1)
    new = write_run(tmp_path / "new", 2, slowdown={("tensorwise", "cublas", "on"): 1 / 1.2})
    result = cli("compare", base, new, "--json", tmp_path / "c.json")
    assert result.exit_code == ExitCode.PASS, result.output
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["verdict"] == "IMPROVEMENT"
    assert report["counts"]["IMPROVEMENT"] == len(SHAPES)


def _inconclusive_pair(tmp_path: Path) -> tuple[Path, Path]:
    """One case about 10% slower on average, but so noisy in the new run that it is not significant."""
    def run(path, factors):
        with RunWriter(path, {"gpu_name": H100}) as writer:
            writer.append(_row(4096, 4096, 4096, "none", "bf16", "n/a", [1.0] * REPEATS))
            writer.append(_row(4096, 4096, 4096, "tensorwise", "cublas", "on", [0.5 * f for f in factors]))
        return path

    base = run(tmp_path / "base", [1.0, 1.01, 0.99, 1.0, 1.005])
    new = run(tmp_path / "new", list(np.exp([0.35, -0.15, 0.30, -0.10, 0.10])))
    return base, new


def test_compare_inconclusive_exits_0_unless_asked_to_fail_on_it(tmp_path):
    base, new = _inconclusive_pair(tmp_path)
    result = cli("compare", base, new, "--junit", tmp_path / "j.xml")
    assert result.exit_code == ExitCode.PASS, result.output
    assert "INCONCLUSIVE" in result.output and "--fail-on-inconclusive" in result.output
    assert ET.parse(tmp_path / "j.xml").getroot().find(".//testcase/skipped") is not None

    result = cli("compare", base, new, "--fail-on-inconclusive", "--junit", tmp_path / "j.xml")
    assert result.exit_code == ExitCode.INCONCLUSIVE, result.output
    assert ET.parse(tmp_path / "j.xml").getroot().find(".//testcase/failure").get("type") == "INCONCLUSIVE"

    suite = tmp_path / "suite.toml"
    suite.write_text('[[bench]]\ncommand = "matmul"\n[gate]\nfail_on_inconclusive = true\n')
    assert cli("compare", base, new, "--suite", suite).exit_code == ExitCode.INCONCLUSIVE
    assert cli("compare", base, new, "--suite", suite, "--no-fail-on-inconclusive").exit_code == ExitCode.PASS


def test_suite_geomean_catches_a_small_slowdown_spread_over_every_case(tmp_path):
    """4% on every case is under the 5% per-case floor, but over the 3% floor of the geomean."""
    everything = {key: 1.04 for key in FP8_CASES}
    base = write_run(tmp_path / "base", 1, noise=0.002)
    new = write_run(tmp_path / "new", 2, noise=0.002, slowdown=everything)
    report_path = tmp_path / "g.json"
    result = cli("compare", base, new, "--json", report_path)
    assert result.exit_code == ExitCode.REGRESSION, result.output
    report = json.loads(report_path.read_text())
    assert report["counts"]["PASS"] == len(SHAPES) * len(FP8_CASES)
    assert report["geomean"]["outcome"] == "REGRESSION"
    assert report["geomean"]["slowdown_pct"] == pytest.approx(4.0, abs=0.5)


def test_compare_absolute_times_uses_the_looser_time_thresholds(tmp_path):
    """A clock drop slows every case alike: same-run speedups cancel it, absolute times see it."""
    base = write_run(tmp_path / "base", 1, noise=0.005)
    with RunWriter(tmp_path / "slow", {"gpu_name": H100}) as writer:
        for row in load_results(base).to_dict("records"):
            times = [t * 1.07 for t in map(float, row["repeat_ms"].split(";"))]
            writer.append(_row(row["M"], row["K"], row["N"], row["granularity"], row["backend"], row["fast_accum"], times))
    assert cli("compare", base, tmp_path / "slow").exit_code == ExitCode.PASS
    result = cli("compare", base, tmp_path / "slow", "--metric", "time", "--json", tmp_path / "t.json")
    assert result.exit_code == ExitCode.REGRESSION, result.output  # 7% < 10% per case; the geomean's floor is 5%
    report = json.loads((tmp_path / "t.json").read_text())
    assert report["metric"] == "time" and report["counts"]["PASS"] == len(report["cases"])
    assert report["geomean"]["outcome"] == "REGRESSION"


def test_compare_reads_results_csvs_and_folders_of_suite_runs(tmp_path):
    base, new = write_run(tmp_path / "b" / "square", 1), write_run(tmp_path / "n" / "square", 2)
    write_run(tmp_path / "b" / "llama", 3)
    assert cli("compare", base / "results.csv", new / "results.csv").exit_code == ExitCode.PASS
    # The new runs lack the baseline's `llama` entry: half its cases unmatched, which fails by default ...
    result = cli("compare", tmp_path / "b", tmp_path / "n", "--json", tmp_path / "s.json")
    assert result.exit_code == ExitCode.INCOMPLETE, result.output
    assert "INCOMPLETE: matched 9 of the baseline's 18 comparable cases" in result.output
    report = json.loads((tmp_path / "s.json").read_text())
    assert {c["run"] for c in report["cases"]} == {"square"}
    assert {c["run"] for c in report["not_compared"]} == {"llama"}
    assert any("'llama' is only in the baseline" in note for note in report["notes"])
    assert (report["verdict"], report["baseline_cases"], report["matched_cases"]) == ("INCOMPLETE", 18, 9)
    # ... and passes where the suite's gate table asks for half of them only.
    suite = tmp_path / "half.toml"
    suite.write_text('[[bench]]\ncommand = "matmul"\n[gate]\nmin_matched_pct = 50\n')
    assert cli("compare", tmp_path / "b", tmp_path / "n", "--suite", suite).exit_code == ExitCode.PASS


def test_compare_refuses_runs_from_another_gpu_model_with_exit_4(tmp_path):
    base = write_run(tmp_path / "base", 1, gpu=H100)
    other = write_run(tmp_path / "other", 2, gpu=H200)
    result = cli("compare", base, other)
    assert result.exit_code == ExitCode.INCOMPATIBLE_BASELINE
    assert "h100-sxm" in result.output and "h200" in result.output and "Traceback" not in result.output
    unknown = write_run(tmp_path / "unknown", 3, gpu=None)
    assert cli("compare", base, unknown).exit_code == ExitCode.INCOMPATIBLE_BASELINE


def test_compare_notes_a_different_power_limit_without_refusing(tmp_path):
    base, new = write_run(tmp_path / "base", 1), write_run(tmp_path / "new", 2)
    for path, watts in ((base, 700), (new, 500)):
        metadata = json.loads((path / "metadata.json").read_text())
        (path / "metadata.json").write_text(json.dumps({**metadata, "power_limit_w": watts}))
    result = cli("compare", base, new)
    assert result.exit_code == ExitCode.PASS
    assert "power_limit_w differs (baseline 700, new 500)" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (("{tmp}/missing", "{base}"), "neither a results CSV"),
        (("{base}", "{base}", "--metric", "tflops"), "unknown metric"),
        (("{base}", "{base}", "--suite", "{tmp}/nope.toml"), "nope.toml"),
        (("{base}", "{tmp}/suite"), "one is a single run"),
        (("{base}", "{base}", "--suite", "{tmp}/bad.toml"), "[gate]: unknown key(s) floor"),
    ],
)
def test_compare_usage_errors_exit_2_with_a_message(tmp_path, args, message):
    base = write_run(tmp_path / "base", 1)
    write_run(tmp_path / "suite" / "entry", 2)
    (tmp_path / "bad.toml").write_text('[[bench]]\ncommand = "matmul"\n[gate]\nfloor = 3\n')
    result = cli("compare", *(a.format(tmp=tmp_path, base=base) for a in args))
    assert result.exit_code == ExitCode.USAGE
    assert message in result.output and "Traceback" not in result.output


# ---- baselines -----------------------------------------------------------------------------------


def test_baseline_save_keys_by_gpu_model_and_refuses_to_overwrite(tmp_path):
    suite_runs = tmp_path / "runs"
    write_run(suite_runs / "square", 1)
    write_run(suite_runs / "llama", 2)
    (suite_runs / "square" / "matmul-tensorwise.html").write_text("<html></html>")
    root = tmp_path / "baselines"
    result = cli("baseline", "save", suite_runs, "--name", "main", "--dir", root)
    assert result.exit_code == 0, result.output
    saved = root / "h100-sxm" / "main"
    assert sorted(p.name for p in saved.iterdir()) == ["llama", "square"]
    assert sorted(p.name for p in (saved / "square").iterdir()) == ["metadata.json", "results.csv"]
    assert (saved / "square" / "results.csv").read_text() == (suite_runs / "square" / "results.csv").read_text()

    again = cli("baseline", "save", suite_runs, "--name", "main", "--dir", root)
    assert again.exit_code == ExitCode.USAGE and "--force" in again.output
    assert cli("baseline", "save", suite_runs, "--name", "main", "--dir", root, "--force").exit_code == 0
    assert cli("baseline", "save", suite_runs, "--name", "../up", "--dir", root).exit_code == ExitCode.USAGE
    assert baselines.resolve("main", root, "h100-sxm") == saved
    with pytest.raises(baselines.IncompatibleBaseline, match="exists for h100-sxm but not for h200"):
        baselines.resolve("main", root, "h200")
    with pytest.raises(ValueError, match="no baseline 'nightly'"):
        baselines.resolve("nightly", root, "h100-sxm")


def test_baseline_save_refuses_a_run_without_a_gpu(tmp_path):
    run = write_run(tmp_path / "cpu", 1, gpu=None)
    result = cli("baseline", "save", run, "--name", "main", "--dir", tmp_path / "b")
    assert result.exit_code == ExitCode.USAGE and "gpu_name" in result.output


# ---- gate ----------------------------------------------------------------------------------------

GATE_SUITE = """
name = "tiny"
[[bench]]
name = "square-4096"
command = "matmul"
shape-gen = "custom"
M = 4096
K = 4096
N = 4096
granularity = "all"
fast-accum = "both"
backend = ["bf16", "cublas"]
repeats = 5
timer = "cuda-events"
[gate]
metric = "speedup"
"""


def _option(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == name]


class FakeMatmul:
    """Stands in for `fp8bench matmul`: writes a synthetic run where the argv says, slowing the
    (granularity, backend, accum) keys of `slow_first` in the suite's run and of `slow_always` in
    every run, re-runs included (`remeasure`: the gate's re-run of one case from its identity)."""

    def __init__(self, slow_first=(), slow_always=()):
        self.calls: list[list[str]] = []
        self.reruns: list[tuple[str, CaseId, Path]] = []
        self.slow_first, self.slow_always = set(slow_first), set(slow_always)

    def remeasure(self, entry, case_id: CaseId, run_dir: Path) -> Path:
        self.reruns.append((entry.name, case_id, run_dir))
        key = (case_id.granularity, case_id.backend, case_id.fast_accum)
        slowdown = {key: 1.2} if key in self.slow_always else {}
        shape = (case_id.M, case_id.K, case_id.N)
        return write_run(run_dir, seed=100 + len(self.reruns), shapes=(shape,), cases=[key], slowdown=slowdown)

    def __call__(self, argv: list[str]) -> None:
        self.calls.append(argv)
        out = Path(_option(argv, "--out")[0])
        rerun = "_reruns" in out.parts
        shape = tuple(int(_option(argv, f"--{d}")[0]) for d in "MKN")
        granularities = ("tensorwise", "axiswise", "blockwise") if _option(argv, "--granularity") == ["all"] else tuple(
            _option(argv, "--granularity")
        )
        accums = ("on", "off") if _option(argv, "--fast-accum") == ["both"] else tuple(_option(argv, "--fast-accum"))
        backends = [b for b in _option(argv, "--backend") if b != "bf16"]
        cases = [(g, b, a) for g in granularities for b in backends for a in accums]
        slow = self.slow_always | (set() if rerun else self.slow_first)
        write_run(out, seed=len(self.calls), shapes=(shape,), cases=cases, slowdown={key: 1.2 for key in slow})


def _suite(tmp_path: Path) -> Path:
    suite = tmp_path / "tiny.toml"
    suite.write_text(GATE_SUITE)
    return suite


def _measure_suite(tmp_path: Path, out: Path, fake: FakeMatmul) -> Path:
    """The tiny suite's runs, as `fp8bench run` would write them."""
    for entry in load_suite(_suite(tmp_path)).entries:
        fake(entry.argv(out))
    return out


def _save_baseline(tmp_path: Path) -> None:
    baselines.save(_measure_suite(tmp_path, tmp_path / "baseline-runs", FakeMatmul()), "main", tmp_path / "baselines")


def _gate(tmp_path: Path, fake: FakeMatmul, gpu: str = H100, **kwargs):
    suite = _suite(tmp_path)
    config = gating.resolve_config(suite, None, None)
    return gating.gate(suite, "main", tmp_path / "baselines", tmp_path / "out", config, {"gpu_name": gpu}, fake, remeasure=fake.remeasure, **kwargs)


def test_gate_reruns_a_flagged_case_once_and_clears_a_transient_slowdown(tmp_path):
    _save_baseline(tmp_path)
    fake = FakeMatmul(slow_first={("axiswise", "cublas", "off")})
    comparison = _gate(tmp_path, fake)
    assert len(fake.calls) == 1 and len(fake.reruns) == 1  # the suite's entry, then one re-run
    entry, case_id, run_dir = fake.reruns[0]
    assert entry == "square-4096" and (case_id.M, case_id.granularity, case_id.backend, case_id.fast_accum) == (4096, "axiswise", "cublas", "off")
    assert run_dir.parts[-3:-1] == ("_reruns", "square-4096")
    (case,) = [c for c in comparison.cases if c.reruns]
    assert (case.case_id.granularity, case.new_repeats) == ("axiswise", 2 * REPEATS)
    # 20% slower in the first run only: not reproduced, so not a regression, but not a clean pass either.
    assert case.outcome is Outcome.INCONCLUSIVE and case.note == "the re-run alone stays within the threshold"
    assert comparison.exit_code is ExitCode.PASS


def test_gate_fails_a_persistent_regression_after_its_rerun(tmp_path):
    _save_baseline(tmp_path)
    comparison = _gate(tmp_path, FakeMatmul(slow_always={("blockwise", "cublas", "off")}))
    (case,) = [c for c in comparison.cases if c.outcome is Outcome.REGRESSION]
    assert case.reruns == 1 and case.case_id.granularity == "blockwise"
    assert comparison.exit_code is ExitCode.REGRESSION


def test_gate_without_reruns_measures_the_suite_only(tmp_path):
    _save_baseline(tmp_path)
    fake = FakeMatmul(slow_first={("axiswise", "cublas", "off")})
    comparison = _gate(tmp_path, fake, rerun=False)
    assert len(fake.calls) == 1 and not fake.reruns and comparison.exit_code is ExitCode.REGRESSION


def test_gate_refuses_a_used_out_folder_and_a_baseline_of_another_model(tmp_path):
    _save_baseline(tmp_path)
    with pytest.raises(baselines.IncompatibleBaseline, match="not for h200"):
        _gate(tmp_path, FakeMatmul(), gpu=H200)
    (tmp_path / "out" / "square-4096").mkdir(parents=True)
    with pytest.raises(gating.UsageError, match="fresh folders"):
        _gate(tmp_path, FakeMatmul())


def test_gate_cli_judges_existing_runs_and_exits_with_the_documented_codes(tmp_path):
    _save_baseline(tmp_path)
    args = ("gate", "--suite", _suite(tmp_path), "--baseline-dir", tmp_path / "baselines")
    good = _measure_suite(tmp_path, tmp_path / "good", FakeMatmul())
    bad = _measure_suite(tmp_path, tmp_path / "bad", FakeMatmul(slow_always={("tensorwise", "cublas", "on")}))
    assert cli(*args, "--baseline", "main", "--runs", good, "--no-rerun").exit_code == ExitCode.PASS
    result = cli(*args, "--baseline", "main", "--runs", bad, "--no-rerun", "--markdown", tmp_path / "g.md")
    assert result.exit_code == ExitCode.REGRESSION, result.output
    assert "| square-4096 | matmul/4096x4096x4096/tensorwise/cublas" in (tmp_path / "g.md").read_text()
    # A baseline path works as well as a name; runs from another GPU model are refused.
    by_path = tmp_path / "baselines" / "h100-sxm" / "main"
    assert cli(*args, "--baseline", by_path, "--runs", good, "--no-rerun").exit_code == ExitCode.PASS
    h200 = tmp_path / "h200"
    write_run(h200 / "square-4096", 9, gpu=H200)
    assert cli(*args, "--baseline", by_path, "--runs", h200, "--no-rerun").exit_code == ExitCode.INCOMPATIBLE_BASELINE
    assert cli(*args, "--baseline", "main", "--runs", h200, "--no-rerun").exit_code == ExitCode.INCOMPATIBLE_BASELINE
    # Measuring (or re-running) needs a GPU: a clear usage error here, not a traceback.
    result = cli(*args, "--baseline", "main")
    assert result.exit_code == ExitCode.USAGE and "--no-rerun" in result.output


def test_ci_suite_command_lines_parse_with_the_real_matmul_command(tmp_path):
    """Each argv must get past option parsing (exit 2 otherwise) to the GPU check, which this CPU
    machine fails; the CI suite's backends (triton included) must resolve."""
    argvs = [entry.argv(tmp_path / "ci") for entry in load_suite(REPO / "suites" / "ci.toml").entries]
    for argv in argvs:
        result = runner.invoke(app, argv)
        assert result.exit_code == 1 and "measures on a CUDA GPU and none is visible here" in result.output, (argv, result.output)


# ---- outputs of an empty comparison --------------------------------------------------------------


def test_a_comparison_with_nothing_compared_is_incomplete_and_every_output_still_renders(tmp_path):
    def failed_run(path):
        with RunWriter(path, {"gpu_name": H100}) as writer:
            writer.append(_row(256, 256, 256, "none", "bf16", "n/a", status="failed: out of memory"))
            writer.append(_row(256, 256, 256, "tensorwise", "cublas", "on", status="failed: out of memory"))
        return path

    comparison = gating.compare_trees(failed_run(tmp_path / "a"), failed_run(tmp_path / "b"), GateConfig())
    assert comparison.verdict is Outcome.INCOMPLETE and comparison.geomean is None
    assert comparison.exit_code is ExitCode.INCOMPLETE
    assert json.loads(json.dumps(to_json(comparison)))["not_compared"][0]["reason"] == (
        "baseline: failed: out of memory; new: failed: out of memory"
    )
    assert ET.fromstring(junit(comparison)).find(".//skipped") is not None
    assert "cases not compared" in markdown(comparison)


def test_gate_reports_a_bad_option_in_a_suite_entry_as_a_usage_error(tmp_path, monkeypatch):
    """The suite's entries run in-process; one that `fp8bench matmul` refuses is exit 2, not a traceback.
    (The GPU check is bypassed: option parsing fails before anything would touch a GPU.)"""
    import fp8bench.cli

    _save_baseline(tmp_path)
    suite = tmp_path / "bad-entry.toml"
    suite.write_text(GATE_SUITE.replace('timer = "cuda-events"', "bogus = 1"))
    monkeypatch.setattr(fp8bench.cli, "require_cuda", lambda command: H100)
    monkeypatch.setattr("fp8bench.harness.env.gpu_metadata", lambda: {"gpu_name": H100, "gpu_memory_gib": 79.2})
    result = cli("gate", "--suite", suite, "--baseline", "main", "--baseline-dir", tmp_path / "baselines", "--out", tmp_path / "o")
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "No such option: --bogus" in result.output and "Traceback" not in result.output


# ---- GPU identity, timing differences, escaping, committed runs -------------------------------------


@pytest.mark.parametrize(
    ("name", "memory", "key"),
    [
        (H100, 79.2, "h100-sxm"),
        (H100, None, "h100-sxm"),
        ("NVIDIA H100 PCIe", 79.2, "h100-pcie"),
        ("NVIDIA H100 NVL", 93.1, "h100-nvl"),
        (H200, 139.8, "h200"),
        ("NVIDIA H200 NVL", 139.8, "nvidia-h200-nvl-140gib"),
        ("NVIDIA GH200 480GB", 94.5, "nvidia-gh200-480gb-94gib"),
        ("NVIDIA GH200 144G HBM3e", 142.0, "nvidia-gh200-144g-hbm3e-142gib"),
        (H100, 94.0, "nvidia-h100-80gb-hbm3-94gib"),  # the name of an SXM part, the memory of another
    ],
)
def test_gpu_models_are_keyed_by_their_exact_name_and_memory(name, memory, key):
    from fp8bench.model.hardware import gpu_key, spec_for_device_name

    assert gpu_key(name, memory) == key
    assert baselines.gpu_model({"gpu_name": name, "gpu_memory_gib": memory}) == key
    assert (spec_for_device_name(name, memory) is not None) == (key in ("h100-sxm", "h100-pcie", "h100-nvl", "h200"))


@pytest.mark.parametrize("other", ["NVIDIA H200 NVL", "NVIDIA GH200 480GB"])
def test_compare_refuses_another_hopper_model_named_like_the_h200(tmp_path, other):
    base = write_run(tmp_path / "base", 1, gpu=H200)
    new = write_run(tmp_path / "new", 2, gpu=other)
    result = cli("compare", base, new)
    assert result.exit_code == ExitCode.INCOMPATIBLE_BASELINE, result.output
    assert result.output.startswith("incompatible baseline: ") and "the baseline was measured on h200" in result.output


def test_a_timer_change_is_marked_on_every_case_or_refused_per_the_suite(tmp_path):
    base = write_run(tmp_path / "base", 1, timer="cuda-events", metadata={"versions": {"torch": "2.11.0"}})
    new = write_run(tmp_path / "new", 2, timer="cupti", metadata={"versions": {"torch": "2.12.0"}})
    result = cli("compare", base, new, "--json", tmp_path / "c.json")
    assert result.exit_code == ExitCode.PASS, result.output
    assert "timed differently from the baseline: timer cuda-events -> cupti; torch 2.11.0 -> 2.12.0" in result.output
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["cases"] and all(c["note"] == gating.TIMED_DIFFERENTLY for c in report["cases"])
    suite = tmp_path / "strict.toml"
    suite.write_text('[[bench]]\ncommand = "matmul"\n[gate]\nenvironment_change = "refuse"\n')
    refused = cli("compare", base, new, "--suite", suite)
    assert refused.exit_code == ExitCode.INCOMPATIBLE_BASELINE, refused.output
    assert 'timed differently from the baseline (timer cuda-events -> cupti; torch 2.11.0 -> 2.12.0)' in refused.output
    assert cli("compare", base, write_run(tmp_path / "same", 3), "--suite", suite).exit_code == ExitCode.PASS


def test_strings_from_result_files_are_escaped_in_every_output(tmp_path):
    hostile = '<img src=x onerror=alert(1)>|[bold red]x[/]\x1b[31m\x07'
    names = {SHAPES[0]: hostile}
    base = write_run(tmp_path / "base", 1, case_names=names)
    new = write_run(tmp_path / "new", 2, case_names=names, slowdown={("tensorwise", "cublas", "on"): 1.3})
    md, xml = tmp_path / "c.md", tmp_path / "c.xml"
    result = cli("compare", base, new, "--markdown", md, "--junit", xml)
    assert result.exit_code == ExitCode.REGRESSION, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "[bold" in result.output and "red]x[/]" in result.output  # shown as written (the table wraps it), not applied
    text = md.read_text()
    assert "<img" not in text and "&lt;img src=x onerror=alert(1)&gt;\\|[bold red]x[/]\\x1b[31m\\x07" in text
    cases = ET.parse(xml).getroot().findall(".//testcase")  # parses: no character XML cannot hold
    assert any(c.get("name").startswith("matmul/<img src=x onerror=alert(1)>|[bold red]x[/]\\x1b[31m") for c in cases)


@pytest.mark.parametrize("run", ["cast-square", "roofline-8192", "matmul-square"])
def test_a_committed_run_compared_with_itself_matches_every_case_and_passes(run):
    """Cast rows leave N empty and roofline rows keep the model's variants in options: the identity
    must still match each case with itself."""
    path = REPO / "reports" / "h100-sxm" / run
    comparison = gating.compare_trees(path, path, GateConfig())
    assert comparison.exit_code is ExitCode.PASS
    assert comparison.baseline_cases > 0 and len(comparison.cases) == comparison.baseline_cases
    assert all(c.outcome is Outcome.PASS for c in comparison.cases)
