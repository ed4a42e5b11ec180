"""A comparison written out: console table (rich), Markdown (CI job summaries), JSON, JUnit XML.

All four show the same columns (`CASE_COLUMNS`, `case_cells`), worst outcome first. Labels, reasons
and notes come from result files, so each output escapes them for what reads it: rich markup and
control characters on the console, HTML and table pipes in Markdown, characters XML cannot hold in
JUnit.
"""

from __future__ import annotations

import html
import json
import math
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fp8bench.gate.compare import CaseComparison, Comparison, Metric, Outcome
from fp8bench.harness.validate import printable

CASE_COLUMNS = ("run", "case", "baseline", "new", "slowdown", "threshold", "p", "base sigma", "repeats", "outcome")
_STYLE = {
    Outcome.PASS: "green", Outcome.IMPROVEMENT: "cyan", Outcome.INCONCLUSIVE: "yellow", Outcome.REGRESSION: "bold red",
    Outcome.INCOMPLETE: "bold red",
}  # fmt: skip
_ORDER = {Outcome.REGRESSION: 0, Outcome.INCOMPLETE: 1, Outcome.INCONCLUSIVE: 2, Outcome.IMPROVEMENT: 3, Outcome.PASS: 4}


@dataclass(frozen=True)
class Outputs:
    """Where to write the report files; None writes none of that kind."""

    markdown: Path | None = None
    json: Path | None = None
    junit: Path | None = None


def _value(metric: Metric, value: float) -> str:
    return f"{value:.3f}x" if metric is Metric.SPEEDUP else f"{value:.4f} ms"


def _number(value: float, spec: str) -> str:
    return "n/a" if math.isnan(value) else format(value, spec)


def sorted_cases(comparison: Comparison) -> list[CaseComparison]:
    return sorted(comparison.cases, key=lambda c: (_ORDER[c.outcome], -c.slowdown_pct, c.run, c.label))


def columns(comparison: Comparison) -> tuple[str, ...]:
    """CASE_COLUMNS, without `run` when every case comes from a single run."""
    return CASE_COLUMNS if any(c.run for c in comparison.cases) else CASE_COLUMNS[1:]


def case_cells(case: CaseComparison, metric: Metric) -> list[str]:
    repeats = f"{case.base_repeats}/{case.new_repeats}" + (" (re-run)" if case.reruns else "")
    return [
        case.run,
        case.label,
        _value(metric, case.base_value),
        _value(metric, case.new_value),
        f"{case.slowdown_pct:+.1f}%",
        f"{case.threshold_pct:.1f}%",
        _number(case.p_value, ".2g"),
        _number(case.base_sigma_pct, ".1f") + "%",
        repeats,
        case.outcome.value + (f" ({case.note})" if case.note else ""),
    ]


def headline(comparison: Comparison) -> str:
    counts = ", ".join(f"{n} {o.value.lower()}" for o, n in comparison.counts().items() if n)
    what = "FP8/BF16 speedups measured in the same run" if comparison.metric is Metric.SPEEDUP else "absolute times"
    return f"{comparison.verdict.value} (exit {int(comparison.exit_code)}): {len(comparison.cases)} cases on {what}" + (
        f" ({counts})" if counts else ""
    )


def coverage_line(comparison: Comparison) -> str:
    """How many of the baseline's cases the new run matched, against what the gate requires."""
    line = (
        f"matched {len(comparison.cases)} of the baseline's {comparison.baseline_cases} comparable cases "
        f"(the gate requires {comparison.min_matched_pct:g}%, and one at least)"
    )
    return line if comparison.complete else f"INCOMPLETE: {line}"


def geomean_line(comparison: Comparison) -> str:
    g = comparison.geomean
    if g is None:
        return "suite geomean: not tested (fewer than 2 cases compared)"
    return (
        f"suite geomean slowdown {g.slowdown_pct:+.2f}% over {g.cases} cases "
        f"(floor {g.floor_pct:g}%, p = {g.p_value:.2g}): {g.outcome.value}"
    )


def print_comparison(console: Console, comparison: Comparison) -> None:
    table = Table(title="slowdown = new cost / baseline cost - 1 (positive is worse)", title_justify="left")
    shown = columns(comparison)
    for column in shown:
        table.add_column(column, justify="left" if column in ("run", "case", "outcome") else "right")
    for case in sorted_cases(comparison):
        cells = [escape(printable(cell)) for cell in case_cells(case, comparison.metric)[-len(shown):]]
        cells[-1] = f"[{_STYLE[case.outcome]}]{cells[-1]}[/]"
        table.add_row(*cells)
    console.print(table)
    # Grouped by reason: a suite has many cases that no backend supports, on both sides alike.
    by_reason: dict[str, list[str]] = {}
    for skipped in comparison.not_compared:
        by_reason.setdefault(skipped.reason, []).append(skipped.where)
    for reason, where in by_reason.items():
        example = where[0] + (f" and {len(where) - 1} more" if len(where) > 1 else "")
        console.print(f"[yellow]not compared[/] ({escape(printable(example))}): {escape(printable(reason))}")
    for note in comparison.notes:
        console.print(f"[yellow]note:[/] {escape(printable(note))}")
    console.print(geomean_line(comparison))
    console.print(coverage_line(comparison), style=None if comparison.complete else _STYLE[Outcome.INCOMPLETE])
    console.print(f"[{_STYLE[comparison.verdict]}]{headline(comparison)}[/]")


def _md(text: str) -> str:
    """Text from a result file in Markdown: HTML escaped (GitHub renders inline HTML), pipes escaped
    (they would end a table cell), control characters shown, one line."""
    return html.escape(printable(text)).replace("|", "\\|")


def _markdown_table(comparison: Comparison, cases: list[CaseComparison]) -> list[str]:
    shown = columns(comparison)
    rows = [[_md(cell) for cell in case_cells(c, comparison.metric)[-len(shown):]] for c in cases]
    align = ["---" if name in ("run", "case", "outcome") else "---:" for name in shown]
    return ["| " + " | ".join(shown) + " |", "|" + "|".join(align) + "|", *("| " + " | ".join(row) + " |" for row in rows)]


def markdown(comparison: Comparison) -> str:
    cases = sorted_cases(comparison)
    flagged = [c for c in cases if c.outcome is not Outcome.PASS]
    lines = [
        f"## fp8bench gate: {comparison.verdict.value}", "", headline(comparison), "", geomean_line(comparison), "",
        coverage_line(comparison), "",
    ]  # fmt: skip
    if flagged:
        lines += ["### Cases that are not PASS", "", *_markdown_table(comparison, flagged), ""]
    lines += [
        f"<details><summary>All {len(cases)} cases</summary>",
        "",
        *_markdown_table(comparison, cases),
        "",
        "</details>",
        "",
    ]
    if comparison.not_compared:
        lines += [f"<details><summary>{len(comparison.not_compared)} cases not compared</summary>", ""]
        lines += [f"- {_md(s.where)}: {_md(s.reason)}" for s in comparison.not_compared]
        lines += ["", "</details>", ""]
    lines += [f"- note: {_md(note)}" for note in comparison.notes]
    return "\n".join(lines) + "\n"


def _finite(value: Any) -> Any:
    """JSON has no NaN: a statistic that could not be computed is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def to_json(comparison: Comparison) -> dict[str, Any]:
    def case(c: CaseComparison) -> dict[str, Any]:
        fields = asdict(c)
        fields.update(label=c.label, outcome=c.outcome.value)
        return fields

    return _finite(
        {
            "verdict": comparison.verdict.value,
            "exit_code": int(comparison.exit_code),
            "metric": comparison.metric.value,
            "fail_on_inconclusive": comparison.fail_on_inconclusive,
            "baseline_cases": comparison.baseline_cases,
            "matched_cases": len(comparison.cases),
            "min_matched_pct": comparison.min_matched_pct,
            "complete": comparison.complete,
            "gate": asdict(comparison.gate),
            "counts": {o.value: n for o, n in comparison.counts().items()},
            "geomean": {**asdict(comparison.geomean), "outcome": comparison.geomean.outcome.value} if comparison.geomean else None,
            "cases": [case(c) for c in sorted_cases(comparison)],
            "not_compared": [{**asdict(s), "label": s.label} for s in comparison.not_compared],
            "notes": list(comparison.notes),
        }
    )


def junit(comparison: Comparison) -> str:
    """One <testsuite> per run (suite entry); a REGRESSION is a <failure>, and so is an INCONCLUSIVE
    case when the comparison fails on those (otherwise it is <skipped>, like a case not compared).
    The `summary` suite holds the coverage (a failure when INCOMPLETE) and the geomean."""
    root = ET.Element("testsuites", name="fp8bench gate")
    suites: dict[str, ET.Element] = {}

    def testcase(run: str, name: str) -> ET.Element:
        if run not in suites:
            suites[run] = ET.SubElement(root, "testsuite", name=f"fp8bench.{printable(run) or 'run'}")
        return ET.SubElement(suites[run], "testcase", classname=f"fp8bench.{printable(run) or 'run'}", name=printable(name), time="0")

    failing = {Outcome.REGRESSION} | ({Outcome.INCONCLUSIVE} if comparison.fail_on_inconclusive else set())
    for case in sorted_cases(comparison):
        element = testcase(case.run, case.label)
        message = printable(" | ".join(f"{k}={v}" for k, v in zip(CASE_COLUMNS[2:], case_cells(case, comparison.metric)[2:])))
        if case.outcome in failing:
            ET.SubElement(element, "failure", message=message, type=case.outcome.value)
        elif case.outcome is Outcome.INCONCLUSIVE:
            ET.SubElement(element, "skipped", message=message)
        else:
            ET.SubElement(element, "system-out").text = message
    for skipped in comparison.not_compared:
        ET.SubElement(testcase(skipped.run, skipped.label), "skipped", message=printable(f"not compared: {skipped.reason}"))
    coverage = testcase("summary", "coverage")
    if not comparison.complete:
        ET.SubElement(coverage, "failure", message=coverage_line(comparison), type=Outcome.INCOMPLETE.value)
    if comparison.geomean is not None:
        element = testcase("summary", "geomean")
        if comparison.geomean.outcome in failing:
            ET.SubElement(element, "failure", message=geomean_line(comparison), type=comparison.geomean.outcome.value)
    for suite in suites.values():
        cases = suite.findall("testcase")
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
        suite.set("skipped", str(sum(c.find("skipped") is not None for c in cases)))
        suite.set("errors", "0")
    for key in ("tests", "failures", "skipped", "errors"):
        root.set(key, str(sum(int(s.get(key)) for s in suites.values())))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_outputs(comparison: Comparison, outputs: Outputs) -> list[Path]:
    """Write the files asked for; return their paths."""
    written = []
    for path, render in (
        (outputs.markdown, markdown),
        (outputs.json, lambda c: json.dumps(to_json(c), indent=2) + "\n"),
        (outputs.junit, junit),
    ):
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(render(comparison))
            written.append(Path(path))
    return written
