"""Seeded fuzz of the files fp8bench reads back: results CSVs, metadata.json and suite files.

Each malformed input is made from a valid one by one mutation (a torn row, a cell that is not a number
or not a time, a repeat count that disagrees with its repeats, a header that is not the schema's, bytes
that are not UTF-8, JSON that is cut or of the wrong type, TOML fields of the wrong type). Every command
that reads it must exit 2 with one line naming the file, and no malformed new run may pass a gate.
"""

from __future__ import annotations

import csv
import io
import json
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fp8bench.cli import app
from fp8bench.gate import baseline as baselines
from fp8bench.gate.compare import ExitCode
from fp8bench.harness.results import Row, RunWriter, format_repeat_times

H100 = "NVIDIA H100 80GB HBM3"
ENTRY = "square"
REPEATS = 5
METADATA = {
    "command": "fp8bench matmul (synthetic fixture of tests/test_malformed_inputs.py)",
    "started_utc": "2026-01-01T10:00:00+00:00",
    "versions": {"torch": "2.11.0", "triton": "3.6.0"},
    "gpu_name": H100,
    "gpu_memory_gib": 79.2,
    "gpu_spec": "h100-sxm",
    "timing": {"repeats": REPEATS},
}
SUITE = f"""name = "fuzz"
out = "runs/fuzz"

[[bench]]
name = "{ENTRY}"
command = "matmul"
shape-gen = "custom"
M = 1024
K = 1024
N = 1024
granularity = "all"
backend = ["bf16", "cublas"]
repeats = {REPEATS}

[gate]
metric = "speedup"
fail_on_inconclusive = true
floor_pct = 5
"""
SEED = 22
runner = CliRunner()


def write_run(path: Path, seed: int) -> Path:
    """A valid matmul run: two shapes, each a BF16 reference and three cuBLAS FP8 cases."""
    rng = np.random.default_rng(seed)
    with RunWriter(path, METADATA) as writer:
        for size in (1024, 2048):
            for granularity, backend, accum in (("none", "bf16", "n/a"), ("tensorwise", "cublas", "on"),
                                                ("axiswise", "cublas", "off"), ("blockwise", "cublas", "off")):
                times = (2e-3 if granularity == "none" else 1.1e-3) * size / 1024 * np.exp(rng.normal(0, 0.01, REPEATS))
                writer.append(Row(dict(
                    benchmark="matmul", case=f"{size}x{size}x{size}", M=size, K=size, N=size, granularity=granularity,
                    backend=backend, recipe="bf16" if granularity == "none" else f"e4m3-{granularity}",
                    fast_accum=accum, options="{}", status="ok", median_ms=float(np.median(times)), repeats=REPEATS,
                    repeat_ms=format_repeat_times(times), timer="cuda-events", samples=100,
                )))  # fmt: skip
    return path


# ---- mutations ---------------------------------------------------------------------------------------

Mutation = Callable[[random.Random, str], "str | bytes"]


def _table(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def _csv(rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue()


def _set_cell(column: str, values: tuple[str, ...]) -> Mutation:
    def mutate(rng: random.Random, text: str) -> str:
        rows = _table(text)
        rows[rng.randrange(1, len(rows))][rows[0].index(column)] = rng.choice(values)
        return _csv(rows)

    mutate.__name__ = f"{column} = bad"
    return mutate


def _torn_row(rng: random.Random, text: str) -> str:
    """The file cut inside a row, before its last field separator: fewer fields than the header."""
    lines = text.splitlines(keepends=True)
    index = rng.randrange(1, len(lines))
    line = lines[index]
    cut = rng.randrange(1, line.rindex(","))
    return "".join(lines[:index]) + line[:cut]


def _torn_repeats(rng: random.Random, text: str) -> str:
    """A row whose repeat_ms lost some of its times (or gained some): its repeats disagree."""
    rows = _table(text)
    row = rows[rng.randrange(1, len(rows))]
    column = rows[0].index("repeat_ms")
    times = row[column].split(";")
    row[column] = ";".join(times[: rng.randrange(1, len(times))] if rng.random() < 0.5 else times + times[:1])
    return _csv(rows)


def _shifted_row(rng: random.Random, text: str) -> str:
    rows = _table(text)
    row = rows[rng.randrange(1, len(rows))]
    if rng.random() < 0.5:
        del row[rng.randrange(len(row))]
    else:
        row.insert(rng.randrange(len(row)), "1")
    return _csv(rows)


def _header(rng: random.Random, text: str) -> str:
    rows = _table(text)
    required = ("benchmark", "case", "M", "granularity", "backend", "status", "repeat_ms", "repeats", "median_ms", "timer")
    column = rows[0].index(rng.choice(required))
    change = rng.randrange(3)
    if change == 0:  # renamed
        rows[0][column] += "_x"
    elif change == 1:  # dropped, from every row
        rows = [row[:column] + row[column + 1:] for row in rows]
    else:  # named twice
        rows[0][column] = rows[0][(column + 1) % len(rows[0])]
    return _csv(rows)


def _duplicated_case(rng: random.Random, text: str) -> str:
    rows = _table(text)
    copy = rows[rng.randrange(1, len(rows))]
    rows.insert(rng.randrange(1, len(rows) + 1), list(copy))
    return _csv(rows)


def _not_utf8(rng: random.Random, text: str) -> bytes:
    data = text.encode()
    at = rng.randrange(len(data))
    return data[:at] + rng.choice([b"\xff", b"\xc3\x28", b"\x80", b"\xe2\x82"]) + data[at:]


def _empty(rng: random.Random, text: str) -> str:
    return rng.choice(["", "\n", "\n\n"])


NOT_A_TIME = ("abc", "nan", "inf", "-inf", "-1", "0", "1e308", "1e-12", "0x10", "1,5", "--")
NOT_A_COUNT = ("1.5", "-3", "x", "nan", "1e400")
CSV_MUTATIONS: tuple[Mutation, ...] = (
    _torn_row, _torn_repeats, _shifted_row, _header, _duplicated_case, _not_utf8, _empty,
    _set_cell("median_ms", NOT_A_TIME),
    _set_cell("wall_ms", NOT_A_TIME),
    _set_cell("repeat_ms", (*NOT_A_TIME, "0.1;;0.2;0.3;0.4", "0.1;abc;0.1;0.1;0.1", ";", "0.1;-1;0.1;0.1;0.1")),
    _set_cell("repeats", NOT_A_COUNT),
    _set_cell("M", NOT_A_COUNT),
    _set_cell("N", NOT_A_COUNT),
    _set_cell("samples", NOT_A_COUNT),
    _set_cell("spread_pct", ("abc", "nan", "inf")),
    _set_cell("tflops", ("abc", "nan", "-inf")),
    _set_cell("status", ("okay", "OK", "unsupported", "failed:", "FAILED: oom", "passed: yes")),
    _set_cell("options", ("{", "[1]", "not json", '"text"', "1")),
)


def _json_text(value) -> str:
    return json.dumps(value)


def _metadata_mutations() -> tuple[Mutation, ...]:
    def truncated(rng, text):
        return text[: rng.randrange(0, len(text) - 1)]

    def not_an_object(rng, text):
        return rng.choice(["[]", "[1, 2]", '"metadata"', "1", "null", "true", "{} {}"])

    def bad_value(rng, text):
        data = json.loads(text)
        key, value = rng.choice([
            ("gpu_name", 5), ("gpu_name", ["H100"]), ("gpu_memory_gib", "80"), ("gpu_memory_gib", True),
            ("versions", "torch 2.11"), ("versions", [1]), ("timing", []), ("timing", "fast"), ("command", 1),
            ("started_utc", {}), ("power_limit_w", "700 W"), ("driver", 580), ("versions", {"torch": 2.11}),
        ])  # fmt: skip
        data[key] = value
        return _json_text(data)

    def not_a_number(rng, text):
        return text.replace('"gpu_memory_gib": 79.2', f'"gpu_memory_gib": {rng.choice(["NaN", "Infinity", "-Infinity"])}')

    return truncated, not_an_object, bad_value, not_a_number, _not_utf8, _empty


METADATA_MUTATIONS = _metadata_mutations()


def _suite_mutations() -> tuple[Mutation, ...]:
    def replace_line(old: str, choices: tuple[str, ...]) -> Mutation:
        def mutate(rng, text):
            assert old in text
            return text.replace(old, rng.choice(choices), 1)

        mutate.__name__ = f"{old.split()[0]} = bad"
        return mutate

    def gate_not_a_table(rng, text):
        """`gate` a value, not a table (its keys then fall into a table of another name)."""
        return rng.choice(("gate = 5", 'gate = "strict"', "gate = [1]", "gate = true")) + "\n" + text.replace("[gate]", "[gates]")

    def truncated(rng, text):
        # cut inside a key or a quoted string: never valid TOML (a cut at a line end could be)
        cuts = [i for i, c in enumerate(text) if c in '"[='][1:]
        return text[: rng.choice(cuts) + 1]

    return (
        replace_line("[[bench]]", ("bench = [1]", "bench = 5", 'bench = "matmul"', "bench = []", "bench = [[1, 2]]")),
        gate_not_a_table,
        replace_line("[gate]", ("[other]", "[gate.speedup]", "[[gate]]")),
        replace_line('name = "fuzz"', ("name = 1", "name = []", 'name = ""', "name = {a = 1}")),
        replace_line('out = "runs/fuzz"', ("out = 5", "out = []", 'out = ""')),
        replace_line('command = "matmul"', ('command = "bogus"', "command = 1", "command = []")),
        replace_line(f'name = "{ENTRY}"', ('name = "../escape"', "name = 5", 'name = ""', 'name = "a/b"')),
        replace_line("repeats = 5", ("repeats = {a = 1}", "repeats = []", "repeats = [true]", "repeats = nan",
                                     "repeats = inf", "repeats = [{x = 1}]", "repeats = 1979-05-27")),
        replace_line('metric = "speedup"', ("metric = 5", 'metric = "fast"', "metric = []")),
        replace_line("fail_on_inconclusive = true", ('fail_on_inconclusive = "yes"', "fail_on_inconclusive = 1",
                                                     "min_matched_pct = 101", "min_matched_pct = -1",
                                                     'min_matched_pct = "all"', 'environment_change = "maybe"',
                                                     "environment_change = 1", "time = 3", "override = 1",
                                                     "override = [1]", '[[gate.override]]\nfloor_pct = 8',
                                                     "unknown_key = 1")),
        replace_line("floor_pct = 5", ('floor_pct = "5"', "floor_pct = -1", "floor_pct = 100", "floor_pct = true",
                                       "k_sigma = -2", "alpha = 2", "alpha = 0", "geomean_floor_pct = []")),
        truncated, _not_utf8,
    )


SUITE_MUTATIONS = _suite_mutations()


def _malformed(count: int, mutations, text: str, rng: random.Random) -> list[tuple[str, str | bytes]]:
    """`count` inputs, every mutation in turn, each different from the valid text."""
    inputs = []
    for index in range(count):
        mutation = mutations[index % len(mutations)]
        mutated = mutation(rng, text)
        assert mutated != text and mutated != text.encode(), mutation.__name__
        inputs.append((f"{mutation.__name__}#{index}", mutated))
    return inputs


# ---- the commands ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A valid baseline (saved for the H100), a valid suite, and the valid texts the mutations start from."""
    root = tmp_path_factory.mktemp("fuzz")
    suite = root / "suite.toml"
    suite.write_text(SUITE)
    base = write_run(root / "base" / ENTRY, seed=1)
    baselines.save(root / "base", "main", root / "baselines")
    template = write_run(root / "template" / ENTRY, seed=2)
    return root, suite, base, (template / "results.csv").read_text(), (template / "metadata.json").read_text()


def _write(path: Path, content: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def cli(*args) -> object:
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "80"})


def assert_one_line_error(result, path: Path, what: str) -> None:
    assert result.exit_code == ExitCode.USAGE, (what, result.exit_code, result.output)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (what, result.output)
    assert str(path) in lines[0], (what, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), (what, result.exception)


def _commands_on_a_new_run(world, new_tree: Path, written: Path) -> dict[str, tuple]:
    """Every command that reads a run, on `new_tree`; what they write goes under `written`."""
    root, suite, base, _, _ = world
    return {
        "compare": ("compare", base, new_tree / ENTRY),
        "gate": ("gate", "--suite", suite, "--baseline", "main", "--baseline-dir", root / "baselines",
                 "--runs", new_tree, "--no-rerun"),
        "report": ("report", new_tree / ENTRY),
        "baseline save": ("baseline", "save", new_tree, "--name", "fuzzed", "--dir", written / "saved"),
        "publish": ("publish", new_tree.parent, "--out", written / "site"),
    }  # fmt: skip


def test_the_valid_inputs_pass_every_command(world, tmp_path):
    """The control: the unmutated files pass, so each refusal below is the mutation's doing."""
    root, suite, base, results, metadata = world
    tree = tmp_path / "reports" / "new"
    _write(tree / ENTRY / "results.csv", results)
    _write(tree / ENTRY / "metadata.json", metadata)
    for name, args in _commands_on_a_new_run(world, tree, tmp_path).items():
        result = cli(*args)
        assert result.exit_code == 0, (name, result.output)


@pytest.mark.parametrize("kind", ["results", "metadata"])
def test_every_command_exits_2_on_a_malformed_run_and_no_gate_passes_it(world, tmp_path, kind):
    """200 malformed results CSVs and 100 malformed metadata files, each the new run of every command
    that reads a run: exit 2 and one line naming the file; a duplicated case is malformed for the
    commands that compare or keep runs, and a report still shows it."""
    root, suite, base, results, metadata = world
    rng = random.Random(SEED if kind == "results" else SEED + 1)
    name = "results.csv" if kind == "results" else "metadata.json"
    if kind == "results":
        inputs = _malformed(200, CSV_MUTATIONS, results, rng)
    else:
        inputs = _malformed(100, METADATA_MUTATIONS, metadata, rng)
    for index, (what, content) in enumerate(inputs):
        tree = tmp_path / f"r{index}" / "new"
        _write(tree / ENTRY / "results.csv", content if kind == "results" else results)
        _write(tree / ENTRY / "metadata.json", content if kind == "metadata" else metadata)
        commands = _commands_on_a_new_run(world, tree, tmp_path)
        if what.startswith("_duplicated_case"):  # one row twice: readable, but not comparable
            commands = {k: v for k, v in commands.items() if k in ("compare", "gate", "baseline save")}
        for command, args in commands.items():
            result = cli(*args)
            assert_one_line_error(result, tree / ENTRY / name, f"{command} on {what}")
    assert not (tmp_path / "site").exists() and not (tmp_path / "saved").exists()  # nothing built from them


def test_compare_and_gate_exit_2_on_a_malformed_suite_file(world, tmp_path):
    """100 malformed suite files, each given to compare (its gate table) and to gate."""
    root, _, base, results, metadata = world
    new = tmp_path / "new"
    _write(new / ENTRY / "results.csv", results)
    _write(new / ENTRY / "metadata.json", metadata)
    for index, (what, content) in enumerate(_malformed(100, SUITE_MUTATIONS, SUITE, random.Random(SEED + 2))):
        suite = tmp_path / f"suite-{index}.toml"
        _write(suite, content)
        compared = cli("compare", base, new / ENTRY, "--suite", suite)
        assert_one_line_error(compared, suite, f"compare on {what}")
        gated = cli("gate", "--suite", suite, "--baseline", "main", "--baseline-dir", root / "baselines", "--runs", new, "--no-rerun")
        assert_one_line_error(gated, suite, f"gate on {what}")


def test_a_run_with_a_header_and_no_rows_fails_compare_and_gate_as_incomplete(world, tmp_path):
    """Not malformed (a run stopped before its first case), but it matched nothing: exit 5, never a pass."""
    root, suite, base, results, metadata = world
    new = tmp_path / "new"
    _write(new / ENTRY / "results.csv", results.splitlines(keepends=True)[0])
    _write(new / ENTRY / "metadata.json", metadata)
    compared = cli("compare", base, new / ENTRY)
    assert compared.exit_code == ExitCode.INCOMPLETE, compared.output
    assert "INCOMPLETE: matched 0 of the baseline's 6 comparable cases" in compared.output
    gated = cli("gate", "--suite", suite, "--baseline", "main", "--baseline-dir", root / "baselines", "--runs", new, "--no-rerun")
    assert gated.exit_code == ExitCode.INCOMPLETE, gated.output


def test_a_run_cut_after_some_rows_fails_as_incomplete(world, tmp_path):
    root, suite, base, results, metadata = world
    new = tmp_path / "new"
    _write(new / ENTRY / "results.csv", "".join(results.splitlines(keepends=True)[:5]))  # the first shape only
    _write(new / ENTRY / "metadata.json", metadata)
    compared = cli("compare", base, new / ENTRY)
    assert compared.exit_code == ExitCode.INCOMPLETE and "matched 3 of the baseline's 6" in compared.output
