"""Comparing a run against a baseline with statistics that hold up on noisy GPUs.

The unit is the repeat (fp8bench.harness.timing: each repeat has its own warm-up and is summarised by its
median; `repeat_ms` holds them). Each case becomes a sample of per-repeat *log costs*:

- metric `speedup` (the default): log(FP8 repeat time / BF16 repeat time), BF16 being the same
  shape's reference measured in the same run. Clock drift between runs scales both and cancels.
- metric `time`: log(repeat time). Drift does not cancel, so its default thresholds are looser.

In log space a change is a ratio whatever the case's size, so one threshold fits all cases and the
suite's mean change is a geometric mean. The *slowdown* of a case is the difference of the mean log
costs, new minus base (positive = worse). A case is a

- REGRESSION when slowdown > max(log(1 + floor), k * sigma) AND a one-sided Welch t-test of the new
  repeats being slower has p < alpha; sigma is the standard deviation of the baseline's repeats;
- INCONCLUSIVE when the slowdown exceeds that threshold but is not significant (the repeats are too
  noisy to tell), or a side has fewer than two repeats;
- IMPROVEMENT, symmetrically, when it got faster by more than the threshold, significantly;
- PASS otherwise.

The floor keeps changes too small to matter from failing however significant they are; k * sigma
widens it for cases whose repeats scatter more than the floor; the t-test keeps a noisy run from
failing on one unlucky repeat. Welch's test (unequal variances) has power with the five repeats a
run has; a rank test reaches p < 0.01 with five a side only when every new repeat is slower than
every old one (p = 1/252). The gate re-runs flagged cases once (`judge_rerun`), and the suite's
geometric-mean change is tested with the cases as units (`geomean`). docs/gating.md has the whole
story, with the error rates.
"""

from __future__ import annotations

import enum
import fnmatch
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from fp8bench.config import Granularity
from fp8bench.harness.results import ID_COLUMNS, repeat_times
from fp8bench.harness.validate import MalformedFile

# What identifies a case across runs: the schema's id columns but `options`, which records what a
# backend chose while measuring (e.g. an autotuned kernel config). A changed choice is a reason for a
# case to get slower, so it must be compared against the old one, not become a new case.
IDENTITY: tuple[str, ...] = tuple(c for c in ID_COLUMNS if c != "options")
BF16_REFERENCE = Granularity.NONE.value  # the granularity of the BF16 reference rows


class Metric(str, enum.Enum):
    SPEEDUP = "speedup"
    TIME = "time"


class Outcome(str, enum.Enum):
    PASS = "PASS"
    REGRESSION = "REGRESSION"
    INCONCLUSIVE = "INCONCLUSIVE"
    IMPROVEMENT = "IMPROVEMENT"
    # A comparison's verdict only: it matched fewer of the baseline's cases than the gate requires.
    INCOMPLETE = "INCOMPLETE"


class EnvironmentPolicy(str, enum.Enum):
    """What a comparison does when the two sides were timed differently (timer, timing policy,
    library versions: fp8bench.gate.baseline.environment_differences)."""

    MARK = "mark"  # compare, and mark every case of the run with what differs
    REFUSE = "refuse"  # exit 4, as for another GPU model


class ExitCode(enum.IntEnum):
    """`fp8bench compare` and `fp8bench gate` exit with these (docs/gating.md)."""

    PASS = 0  # improvements included
    REGRESSION = 1
    USAGE = 2  # bad options or files (click's own code for usage errors)
    INCONCLUSIVE = 3  # only with --fail-on-inconclusive; otherwise inconclusive cases exit 0
    INCOMPATIBLE_BASELINE = 4  # measured on another GPU model (or timed differently, when the suite refuses that)
    INCOMPLETE = 5  # matched fewer of the baseline's cases than the gate requires (min_matched_pct), or none


@dataclass(frozen=True)
class Thresholds:
    """When a case's change counts: above max(floor, k * sigma of the baseline) and p < alpha."""

    floor_pct: float = 5.0
    k_sigma: float = 2.0
    alpha: float = 0.01

    def __post_init__(self) -> None:
        _check_number("floor_pct", self.floor_pct, 0, 100)
        _check_number("k_sigma", self.k_sigma, 0, 100)
        _check_number("alpha", self.alpha, 0, 0.5, low_inclusive=False)


def _check_number(name: str, value: Any, low: float, high: float, low_inclusive: bool = True) -> None:
    """TOML gives ints, floats and booleans alike; only numbers in [low, high) are thresholds."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not is_number or not (low <= value < high if low_inclusive else low < value < high):
        raise ValueError(f"{name} must be a number in {'[' if low_inclusive else '('}{low}, {high}), got {value!r}")


@dataclass(frozen=True)
class Override:
    """Thresholds for the cases whose label matches a glob (fnmatch: `*` also crosses `/`)."""

    match: str
    floor_pct: float | None = None
    k_sigma: float | None = None
    alpha: float | None = None

    def apply(self, thresholds: Thresholds) -> Thresholds:
        changes = {f.name: getattr(self, f.name) for f in fields(Thresholds) if getattr(self, f.name) is not None}
        return replace(thresholds, **changes)


@dataclass(frozen=True)
class MetricGate:
    """How one metric is gated: thresholds, their per-case overrides, and the suite geomean's floor."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    overrides: tuple[Override, ...] = ()
    geomean_floor_pct: float = 3.0

    def __post_init__(self) -> None:
        _check_number("geomean_floor_pct", self.geomean_floor_pct, 0, 100)

    def thresholds_for(self, label: str) -> Thresholds:
        """The base thresholds with every matching override applied in file order (later ones win)."""
        thresholds = self.thresholds
        for override in self.overrides:
            if fnmatch.fnmatchcase(label, override.match):
                thresholds = override.apply(thresholds)
        return thresholds


# Defaults. Speedups: with 5 repeats a side and 2% noise per repeat, k = 2 detects an 8% slowdown in
# about 97% of trials and k = 3 in only about 80% (sigma estimated from 5 repeats is often 1.5x too
# large), while the floor alone keeps false fails near 0.005%. Times: drift does not cancel, so looser.
DEFAULT_GATES: dict[Metric, MetricGate] = {
    Metric.SPEEDUP: MetricGate(Thresholds(floor_pct=5.0, k_sigma=2.0, alpha=0.01), geomean_floor_pct=3.0),
    Metric.TIME: MetricGate(Thresholds(floor_pct=10.0, k_sigma=3.0, alpha=0.01), geomean_floor_pct=5.0),
}

_THRESHOLD_KEYS = tuple(f.name for f in fields(Thresholds))
_METRIC_GATE_KEYS = (*_THRESHOLD_KEYS, "geomean_floor_pct", "override")


@dataclass(frozen=True)
class GateConfig:
    """A suite file's [gate] table (see `from_table`), or the defaults."""

    metric: Metric = Metric.SPEEDUP
    fail_on_inconclusive: bool = False
    speedup: MetricGate = DEFAULT_GATES[Metric.SPEEDUP]
    time: MetricGate = DEFAULT_GATES[Metric.TIME]
    # Share of the baseline's comparable cases the new run must match (measured, ok, on both sides);
    # fewer, or none at all, is INCOMPLETE (exit 5): a run that crashed half-way compares nothing.
    min_matched_pct: float = 100.0
    environment_change: EnvironmentPolicy = EnvironmentPolicy.MARK

    def __post_init__(self) -> None:
        _check_number("min_matched_pct", self.min_matched_pct, 0, 100.0001)

    def for_metric(self, metric: Metric) -> MetricGate:
        return self.speedup if metric is Metric.SPEEDUP else self.time

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> "GateConfig":
        """Parse a [gate] table:

            [gate]
            metric = "speedup"              # what `gate` and `compare --suite` gate on by default
            fail_on_inconclusive = false
            min_matched_pct = 100           # share of the baseline's cases the new run must match
            environment_change = "mark"     # or "refuse": timer, timing policy or versions differ
            floor_pct = 5                   # thresholds for speedups ...
            k_sigma = 2
            alpha = 0.01
            geomean_floor_pct = 3
            [[gate.override]]               # ... and per-case overrides, by glob on the case label
            match = "matmul/*/blockwise/*"
            floor_pct = 8
            [gate.time]                     # the same keys (and [[gate.time.override]]) for times
            floor_pct = 10

        Raises ValueError naming the offending table and key.
        """
        where = "[gate]"
        table = dict(table)
        time_table = table.pop("time", {})
        unknown = set(table) - {"metric", "fail_on_inconclusive", "min_matched_pct", "environment_change", *_METRIC_GATE_KEYS}
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        try:
            metric = Metric(table.pop("metric", Metric.SPEEDUP.value))
        except (ValueError, TypeError):
            raise ValueError(f"{where}: metric must be one of {', '.join(m.value for m in Metric)}") from None
        fail_on_inconclusive = table.pop("fail_on_inconclusive", False)
        if not isinstance(fail_on_inconclusive, bool):
            raise ValueError(f"{where}: fail_on_inconclusive must be true or false")
        if not isinstance(time_table, Mapping):
            raise ValueError(f"{where}: `time` must be a table ([gate.time])")
        try:
            environment_change = EnvironmentPolicy(table.pop("environment_change", EnvironmentPolicy.MARK.value))
        except (ValueError, TypeError):
            raise ValueError(f"{where}: environment_change must be one of {', '.join(p.value for p in EnvironmentPolicy)}") from None
        min_matched_pct = table.pop("min_matched_pct", 100.0)
        try:
            _check_number("min_matched_pct", min_matched_pct, 0, 100.0001)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        return cls(
            metric,
            fail_on_inconclusive,
            _metric_gate(table, DEFAULT_GATES[Metric.SPEEDUP], where),
            _metric_gate(time_table, DEFAULT_GATES[Metric.TIME], "[gate.time]"),
            min_matched_pct,
            environment_change,
        )


def _metric_gate(table: Mapping[str, Any], default: MetricGate, where: str) -> MetricGate:
    unknown = set(table) - set(_METRIC_GATE_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    overrides = table.get("override", [])
    if not isinstance(overrides, list):
        raise ValueError(f"{where}: `override` must be an array of tables ([[...override]])")
    parsed = tuple(_override(o, f"{where} override #{i + 1}") for i, o in enumerate(overrides))
    try:
        thresholds = replace(default.thresholds, **{k: table[k] for k in _THRESHOLD_KEYS if k in table})
        return MetricGate(thresholds, parsed, table.get("geomean_floor_pct", default.geomean_floor_pct))
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def _override(table: Any, where: str) -> Override:
    if not isinstance(table, Mapping) or not isinstance(table.get("match"), str) or not table["match"]:
        raise ValueError(f"{where} needs `match`, a glob on case labels such as \"matmul/*/blockwise/*\"")
    unknown = set(table) - {"match", *_THRESHOLD_KEYS}
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    if len(table) == 1:
        raise ValueError(f"{where} sets no threshold (one of {', '.join(_THRESHOLD_KEYS)})")
    override = Override(**table)
    try:
        override.apply(Thresholds())  # validates the values
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return override


# ---- cases and their samples ------------------------------------------------------------------


@dataclass(frozen=True)
class CaseId:
    """A case, by the IDENTITY columns of the result schema."""

    benchmark: str
    case: str
    M: int
    K: int
    N: int
    granularity: str
    backend: str
    recipe: str
    fast_accum: str
    # e2e's further identity (fp8bench.harness.results.OPTIONAL_ID_COLUMNS); empty for the other benchmarks
    world_size: str = ""
    compile: str = ""
    activation_checkpointing: str = ""
    lm_head: str = ""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "CaseId":
        """The identity of a row; a dimension the row leaves empty (NaN as read) is None, which, unlike
        NaN, equals itself: a cast row's N in files written before every id column had a value."""
        return cls(**{name: None if _is_missing(row[name]) else row[name] for name in IDENTITY})

    @property
    def label(self) -> str:
        """What [[gate.override]] globs match, e.g. matmul/4096x4096x4096/blockwise/cublas/e4m3-blockwise/accum-on."""
        accum = "na" if self.fast_accum == "n/a" else self.fast_accum
        return "/".join((self.benchmark, self.case, self.granularity, self.backend, self.recipe, f"accum-{accum}"))


@dataclass(frozen=True)
class RunSamples:
    """One run's cases as per-repeat log costs, and the cases it cannot compare with why."""

    metric: Metric
    samples: Mapping[CaseId, tuple[float, ...]]
    problems: Mapping[CaseId, str]


def run_samples(frame: pd.DataFrame, metric: Metric) -> RunSamples:
    """Per-repeat log costs of every comparable case of a run (see the module docstring).

    Speedup samples pair repeat i of the FP8 case with repeat i of its BF16 reference. Why not all
    n x n pairs: the mean of all pairwise log ratios equals the mean of the paired ones (both are the
    difference of the two means), so pairing loses nothing in the estimate; but the n^2 ratios reuse
    each repeat n times, are correlated, and a t-test that took them as n^2 independent samples would
    under-state the standard error by about sqrt(n) and fail far more often than alpha. The n paired
    ratios use each repeat once, so they are independent and their variance estimates
    Var(log fp8) + Var(log bf16) without bias. And pairs never straddle two runs: when a re-run's
    repeats are merged in, drift between the run and the re-run cancels within every pair.
    """
    samples: dict[CaseId, tuple[float, ...]] = {}
    problems: dict[CaseId, str] = {}
    rows = [row for row in frame.to_dict("records") if not _is_prediction(row)]
    check_unique(frame)
    references: dict[tuple, list[dict]] = {}
    for row in rows:
        if row["granularity"] == BF16_REFERENCE:
            references.setdefault(_shape_key(row), []).append(row)
    for row in rows:
        case_id = CaseId.from_row(row)
        if metric is Metric.SPEEDUP and row["granularity"] == BF16_REFERENCE:
            continue  # the denominator of the others' speedups
        problem = _repeat_problem(row)
        if problem is None and metric is Metric.SPEEDUP:
            reference = _reference(references.get(_shape_key(row), []))
            problem = reference if isinstance(reference, str) else _repeat_problem(reference, "BF16 reference: ")
        if problem is not None:
            problems[case_id] = problem
            continue
        times = np.log(repeat_times(row["repeat_ms"]))
        if metric is Metric.SPEEDUP:
            reference_times = np.log(repeat_times(reference["repeat_ms"]))
            pairs = min(len(times), len(reference_times))
            times = times[:pairs] - reference_times[:pairs]
        samples[case_id] = tuple(float(v) for v in times)
    return RunSamples(metric, samples, problems)


# The columns an FP8 case shares with its BF16 reference: the shape, and e2e's group (world size, compile
# mode, checkpointing; empty for the other benchmarks), whose BF16 reference runs eagerly and compiled.
# lm_head is not among them: an FP8 LM head is measured against the BF16 model.
REFERENCE_KEY = ("benchmark", "case", "M", "K", "N", "world_size", "compile", "activation_checkpointing")


def _is_missing(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _shape_key(row: Mapping[str, Any]) -> tuple:
    return tuple(None if _is_missing(row[c]) else row[c] for c in REFERENCE_KEY)


def _is_prediction(row: Mapping[str, Any]) -> bool:
    """A roofline model row: predicted, never measured, so nothing to compare."""
    return not _is_missing(row["predicted_ms"]) and _is_missing(row["median_ms"]) and not row["repeat_ms"]


def check_unique(frame: pd.DataFrame) -> None:
    """A case measured twice in one run makes it unclear which to compare: MalformedFile naming the
    file and both lines (load_results indexes rows by line and keeps the path). Rows that measured
    nothing (unsupported, failed, predicted) are told apart by their options as well: files written
    before every id column held the whole identity kept the roofline model's variants there."""
    first_line: dict[tuple, int] = {}
    for line, row in zip(frame.index, frame.to_dict("records")):
        if _is_prediction(row):
            continue
        case_id = CaseId.from_row(row)
        key = (case_id,) if row["repeat_ms"] else (case_id, row["options"])
        if key in first_line:
            raise MalformedFile(
                frame.attrs.get("path", "results"), f"lines {first_line[key]} and {line} hold the same case {case_id.label}"
            )
        first_line[key] = line


def _reference(candidates: list[dict]) -> dict | str:
    """The shape's BF16 reference row (backend `bf16` where several exist), or why there is none."""
    if len(candidates) > 1:
        candidates = [row for row in candidates if row["backend"] == "bf16"]
    if len(candidates) != 1:
        return "no BF16 reference row for this shape in the run" if not candidates else "several BF16 reference rows"
    return candidates[0]


def _repeat_problem(row: Mapping[str, Any], prefix: str = "") -> str | None:
    if row["status"] != "ok":
        return f"{prefix}{row['status']}"
    try:
        times = repeat_times(str(row["repeat_ms"]))
    except ValueError:
        return f"{prefix}unreadable repeat_ms {row['repeat_ms']!r}"
    if not times or not all(math.isfinite(t) and t > 0 for t in times):
        return f"{prefix}no positive repeat times in repeat_ms {row['repeat_ms']!r}"
    return None


# ---- the statistics ---------------------------------------------------------------------------


_OUTCOMES = tuple(Outcome)  # np.select works on numbers: a Judgement holds outcomes by index
_CODE = {outcome: code for code, outcome in enumerate(_OUTCOMES)}


@dataclass(frozen=True)
class Judgement:
    """`judge` over a batch of comparisons (arrays of one shape; 0-d for one case)."""

    slowdown: np.ndarray  # mean log cost, new - base
    threshold: np.ndarray  # max(log(1 + floor), k * sigma of the baseline), log units
    base_sigma: np.ndarray  # standard deviation of the baseline's log costs
    p_slower: np.ndarray  # one-sided Welch p of "new is slower"
    codes: np.ndarray  # index into Outcome

    def is_(self, outcome: Outcome) -> np.ndarray:
        return self.codes == _CODE[outcome]

    def outcome(self) -> Outcome:
        """The outcome of a single case (0-d judgement)."""
        return _OUTCOMES[int(self.codes)]


def judge(base: np.ndarray, new: np.ndarray, thresholds: Thresholds) -> Judgement:
    """Decide cases from their per-repeat log costs; the last axis holds the repeats, at least 2 a side.

    Batched so that the simulation in tests/test_compare.py runs thousands of cases in one call
    through the same code that decides a real case.
    """
    base = np.asarray(base, dtype=float)
    new = np.asarray(new, dtype=float)
    if base.shape[-1] < 2 or new.shape[-1] < 2:
        raise ValueError("judging a case needs at least 2 repeats a side")
    slowdown = new.mean(axis=-1) - base.mean(axis=-1)
    base_sigma = base.std(axis=-1, ddof=1)
    threshold = np.maximum(math.log1p(thresholds.floor_pct / 100), thresholds.k_sigma * base_sigma)
    standard_error = np.sqrt(new.var(axis=-1, ddof=1) / new.shape[-1] + base.var(axis=-1, ddof=1) / base.shape[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # zero variance: handled just below
        p_slower = np.asarray(stats.ttest_ind(new, base, axis=-1, equal_var=False, alternative="greater").pvalue)
    # Identical repeats on both sides (no noise at all): the sign of the change is certain.
    p_slower = np.where(standard_error > 0, p_slower, np.where(slowdown > 0, 0.0, 1.0))
    codes = np.select(
        [
            (slowdown > threshold) & (p_slower < thresholds.alpha),
            slowdown > threshold,
            (-slowdown > threshold) & (1 - p_slower < thresholds.alpha),
        ],
        [_CODE[Outcome.REGRESSION], _CODE[Outcome.INCONCLUSIVE], _CODE[Outcome.IMPROVEMENT]],
        default=_CODE[Outcome.PASS],
    )
    return Judgement(slowdown, threshold, base_sigma, p_slower, codes)


def needs_rerun(outcome: Outcome) -> bool:
    """Flagged cases are measured once more (see `judge_rerun`) before they fail."""
    return outcome in (Outcome.REGRESSION, Outcome.INCONCLUSIVE)


def judge_rerun(base: np.ndarray, new: np.ndarray, fresh: np.ndarray, thresholds: Thresholds) -> tuple[Judgement, np.ndarray]:
    """Decide flagged cases again on the first run's repeats and a re-run's together; also return
    whether the re-run alone reproduces a slowdown beyond the threshold.

    A REGRESSION the re-run does not reproduce becomes INCONCLUSIVE: it was more likely a disturbance
    of the first run (another job on the GPU, a throttling episode) than of the code. The repeats of
    one run share such a disturbance, so their t-test cannot tell it from a real change; a second,
    independent run can.
    """
    base, fresh = np.asarray(base, dtype=float), np.asarray(fresh, dtype=float)
    merged = judge(base, np.concatenate([np.asarray(new, dtype=float), fresh], axis=-1), thresholds)
    reproduced = fresh.mean(axis=-1) - base.mean(axis=-1) > merged.threshold
    codes = np.where(merged.is_(Outcome.REGRESSION) & ~reproduced, _CODE[Outcome.INCONCLUSIVE], merged.codes)
    return replace(merged, codes=codes), reproduced


def _pct(log_ratio: float) -> float:
    return 100.0 * math.expm1(log_ratio)


@dataclass(frozen=True)
class CaseRef:
    """A case of a run: the suite entry ("" for a single run) and the case's identity."""

    run: str
    case_id: CaseId

    @property
    def label(self) -> str:
        return self.case_id.label

    @property
    def where(self) -> str:
        return f"{self.run}/{self.label}" if self.run else self.label


@dataclass(frozen=True)
class CaseComparison(CaseRef):
    """One case's verdict. Percentages are ratios: slowdown_pct = 100 * (new cost / base cost - 1)."""

    outcome: Outcome
    slowdown_pct: float
    threshold_pct: float
    p_value: float  # one-sided, in the direction of the observed change
    base_sigma_pct: float
    base_value: float  # speedup (x) or time (ms): the geometric mean over repeats
    new_value: float
    base_repeats: int
    new_repeats: int
    reruns: int = 0
    note: str = ""


def compare_case(
    run: str,
    case_id: CaseId,
    metric: Metric,
    base: tuple[float, ...],
    new: tuple[float, ...],
    thresholds: Thresholds,
    fresh: tuple[float, ...] | None = None,
) -> CaseComparison:
    """Judge one case; with `fresh` (a re-run's repeats) as `judge_rerun` does."""
    merged = new + (fresh or ())

    def value(logs: tuple[float, ...]) -> float:
        center = float(np.mean(logs))
        return math.exp(-center) if metric is Metric.SPEEDUP else math.exp(center)

    common = dict(
        run=run, case_id=case_id, base_value=value(base), new_value=value(merged),
        base_repeats=len(base), new_repeats=len(merged), reruns=int(fresh is not None),
    )
    if min(len(base), len(merged)) < 2:
        return CaseComparison(
            outcome=Outcome.INCONCLUSIVE, slowdown_pct=_pct(float(np.mean(merged) - np.mean(base))),
            threshold_pct=thresholds.floor_pct, p_value=math.nan, base_sigma_pct=math.nan,
            note="a side has fewer than 2 repeats: no test possible", **common,
        )
    note = ""
    if fresh is None:
        j = judge(np.array(base), np.array(new), thresholds)
    else:
        j, reproduced = judge_rerun(np.array(base), np.array(new), np.array(fresh), thresholds)
        note = "" if reproduced else "the re-run alone stays within the threshold"
    slowdown = float(j.slowdown)
    p_slower = float(j.p_slower)
    return CaseComparison(
        outcome=j.outcome(),
        slowdown_pct=_pct(slowdown),
        threshold_pct=_pct(float(j.threshold)),
        p_value=p_slower if slowdown >= 0 else 1 - p_slower,
        base_sigma_pct=100.0 * float(j.base_sigma),
        note=note,
        **common,
    )


@dataclass(frozen=True)
class NotCompared(CaseRef):
    """A case reported but not compared: not ok on a side, or present on one side only."""

    reason: str


def compare_runs(run: str, base: RunSamples, new: RunSamples, gate: MetricGate) -> tuple[list[CaseComparison], list[NotCompared]]:
    """Every case of two runs of one suite entry, compared or said why not (baseline order first)."""
    if base.metric is not new.metric:
        raise ValueError("both runs must be sampled for the same metric")
    compared: list[CaseComparison] = []
    skipped: list[NotCompared] = []
    for case_id in dict.fromkeys([*base.samples, *base.problems, *new.samples, *new.problems]):
        if case_id in base.samples and case_id in new.samples:
            thresholds = gate.thresholds_for(case_id.label)
            compared.append(compare_case(run, case_id, base.metric, base.samples[case_id], new.samples[case_id], thresholds))
            continue
        reasons = [
            f"{side}: {problems[case_id] if case_id in problems else 'not in the run'}"
            for side, present, problems in (("baseline", base.samples, base.problems), ("new", new.samples, new.problems))
            if case_id not in present
        ]
        skipped.append(NotCompared(run, case_id, "; ".join(reasons)))
    return compared, skipped


@dataclass(frozen=True)
class GeomeanComparison:
    """The suite's mean log change over compared cases, tested with the cases as the units."""

    slowdown_pct: float
    floor_pct: float
    p_value: float  # one-sided one-sample t-test over cases, in the direction of the change
    cases: int
    outcome: Outcome


def geomean(cases: list[CaseComparison], gate: MetricGate, alpha: float) -> GeomeanComparison | None:
    """None with fewer than 2 cases (no spread between cases to test against)."""
    changes = np.log1p(np.array([c.slowdown_pct for c in cases]) / 100)
    if len(changes) < 2:
        return None
    mean = float(changes.mean())
    if np.ptp(changes) == 0:
        p_slower = 0.0 if mean > 0 else 1.0
    else:
        p_slower = float(stats.ttest_1samp(changes, 0.0, alternative="greater").pvalue)
    floor = math.log1p(gate.geomean_floor_pct / 100)
    p_value = p_slower if mean >= 0 else 1 - p_slower
    if abs(mean) <= floor:
        outcome = Outcome.PASS
    elif p_value >= alpha:
        outcome = Outcome.INCONCLUSIVE if mean > 0 else Outcome.PASS
    else:
        outcome = Outcome.REGRESSION if mean > 0 else Outcome.IMPROVEMENT
    return GeomeanComparison(_pct(mean), gate.geomean_floor_pct, p_value, len(changes), outcome)


# Worst first: what a suite's verdict is when its cases disagree.
_SEVERITY = (Outcome.REGRESSION, Outcome.INCOMPLETE, Outcome.INCONCLUSIVE, Outcome.IMPROVEMENT, Outcome.PASS)


@dataclass(frozen=True)
class Comparison:
    """A whole comparison: every case, what was not compared, the geomean, and the verdict."""

    metric: Metric
    gate: MetricGate
    fail_on_inconclusive: bool
    cases: tuple[CaseComparison, ...]
    not_compared: tuple[NotCompared, ...]
    geomean: GeomeanComparison | None
    baseline_cases: int  # the baseline's comparable cases (measured and ok)
    min_matched_pct: float
    notes: tuple[str, ...] = ()  # what else the reader should know (e.g. a different power limit)

    @classmethod
    def build(cls, metric: Metric, config: GateConfig, cases, not_compared, baseline_cases: int, notes=()) -> "Comparison":
        gate = config.for_metric(metric)
        summary = geomean(list(cases), gate, gate.thresholds.alpha)
        return cls(
            metric, gate, config.fail_on_inconclusive, tuple(cases), tuple(not_compared), summary, baseline_cases,
            config.min_matched_pct, tuple(notes),
        )  # fmt: skip

    @property
    def complete(self) -> bool:
        """Whether the new run matched at least min_matched_pct of the baseline's cases, and one at least."""
        return bool(self.cases) and len(self.cases) >= math.ceil(self.min_matched_pct / 100 * self.baseline_cases - 1e-9)

    @property
    def verdict(self) -> Outcome:
        """The worst outcome of any case or the geomean; INCOMPLETE when too few cases were compared."""
        outcomes = {c.outcome for c in self.cases} | ({self.geomean.outcome} if self.geomean else set())
        if not self.complete:
            outcomes.add(Outcome.INCOMPLETE)
        return next(o for o in _SEVERITY if o in outcomes)

    @property
    def exit_code(self) -> ExitCode:
        if self.verdict is Outcome.REGRESSION:
            return ExitCode.REGRESSION
        if self.verdict is Outcome.INCOMPLETE:
            return ExitCode.INCOMPLETE
        if self.verdict is Outcome.INCONCLUSIVE and self.fail_on_inconclusive:
            return ExitCode.INCONCLUSIVE
        return ExitCode.PASS

    def counts(self) -> dict[Outcome, int]:
        return {o: sum(c.outcome is o for c in self.cases) for o in Outcome}
