"""`fp8bench numerics compare-loss`: a loss run gated on the stored reference run (tests/data/numerics-loss-tiny,
made by `fp8bench numerics loss` on the CPU, its command in its metadata.json; its curves are a plain
curves.csv, as an older fp8bench wrote them): within the tolerance at every checkpoint passes, a curve moved
beyond it either way fails, a missing curve is incomplete, a malformed or missing file is one line naming it,
exit 2. The runs judged are gzip-compressed curves.csv.gz files unless a test says otherwise."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fp8bench.cli import app
from fp8bench.harness.curves import (
    CHECKPOINTS, CURVES_CSV, HEADER, LEGACY_CURVES_CSV, append_member, checkpoint_steps, read_loss_curves, read_values_text, relative_gap,
)

REFERENCE = Path(__file__).parent / "data" / "numerics-loss-tiny"
CURVES = ("bf16-seed0", "bf16-seed1")
STEPS = 40


def _compare(base: Path, new: Path, *options: str):
    return CliRunner().invoke(app, ["numerics", "compare-loss", str(base), str(new), *options], env={"COLUMNS": "300"})


def _rows() -> list[list[str]]:
    return list(csv.reader(io.StringIO((REFERENCE / LEGACY_CURVES_CSV).read_text(), newline="")))


def _text(rows: list[list[str]]) -> str:
    buffer = io.StringIO(newline="")
    csv.writer(buffer).writerows(rows)
    return buffer.getvalue()


def _write(run: Path, rows: list[list[str]] | str, name: str = CURVES_CSV) -> Path:
    """A run folder holding `rows` (or text) as its curves file: curves.csv.gz as the benchmark writes it (one
    gzip member per curve), or a plain curves.csv."""
    run.mkdir(parents=True, exist_ok=True)
    text = rows if isinstance(rows, str) else _text(rows)
    if name == LEGACY_CURVES_CSV:
        (run / name).write_text(text, newline="")
        return run
    header, _, values = text.partition("\n")
    by_curve: dict[str, list[str]] = {}
    for line in values.splitlines(keepends=True):
        by_curve.setdefault(line.split(",", 1)[0], []).append(line)
    members = [header + "\n", *("".join(lines) for lines in by_curve.values())] if header else []
    (run / name).touch()
    for member in members:
        append_member(run / name, member)
    return run


def _scaled(run: Path, curve: str, factor: float, from_step: int = 1) -> Path:
    """The reference with `curve`'s loss times `factor` from `from_step` on."""
    rows = _rows()
    for row in rows[1:]:
        if row[0] == curve and row[2] == "loss" and int(row[1]) >= from_step:
            row[5] = repr(float(row[5]) * factor)
    return _write(run, rows)


def test_the_stored_reference_was_made_by_the_numerics_loss_command():
    metadata = json.loads((REFERENCE / "metadata.json").read_text())
    assert metadata["command"].startswith("fp8bench numerics loss --model tiny") and metadata["device"] == "cpu"
    losses = read_loss_curves(REFERENCE)
    assert list(losses) == list(CURVES) and all(len(curve) == STEPS for curve in losses.values())
    # The gaps the benchmark wrote at its checkpoints are the ones compare-loss computes.
    written = {int(row[1]): float(row[5]) for row in _rows()[1:] if row[0] == "bf16-seed1" and row[2] == "loss_gap"}
    assert list(written) == list(checkpoint_steps(STEPS)) == [10, 20, 30, 40]
    for step, gap in written.items():
        assert gap == pytest.approx(relative_gap(losses["bf16-seed1"][:step], losses["bf16-seed0"][:step]), abs=1e-7)
    assert tuple(checkpoint_steps(STEPS).values()) == CHECKPOINTS


def test_the_reference_passes_against_itself_and_against_a_run_within_the_tolerance(tmp_path):
    same = _compare(REFERENCE, REFERENCE)
    assert same.exit_code == 0 and "PASS: 8 checkpoints within 1.00%" in same.output, same.output
    within = _scaled(tmp_path / "new", "bf16-seed0", 1.008)
    result = _compare(REFERENCE, within / CURVES_CSV)  # a run folder or its curves file
    assert result.exit_code == 0 and "+0.80%" in result.output, result.output


def test_a_compressed_run_reads_as_its_plain_text_and_gates_both_ways(tmp_path):
    """curves.csv.gz of several members holds the reference's rows: the same curves, PASS either way round."""
    run = _write(tmp_path / "new", _rows())
    assert read_values_text(run / CURVES_CSV) == (REFERENCE / LEGACY_CURVES_CSV).read_bytes().decode()
    assert read_loss_curves(run) == read_loss_curves(REFERENCE)
    assert read_loss_curves(run)["bf16-seed1"][:2] == [float(r[5]) for r in _rows()[1:] if r[0] == "bf16-seed1" and r[2] == "loss"][:2]
    for base, new in ((REFERENCE, run), (run, REFERENCE), (run, run)):
        result = _compare(base, new)
        assert result.exit_code == 0 and "PASS: 8 checkpoints within 1.00%" in result.output, result.output
    scaled = _scaled(tmp_path / "scaled", "bf16-seed1", 1.02, from_step=31)
    assert _compare(run, scaled).exit_code == 1


def test_a_run_killed_while_appending_keeps_its_whole_rows(tmp_path):
    """The last member cut short: every row before the cut is read, the curve it was writing up to there."""
    run = _write(tmp_path / "new", _rows())
    data = (run / CURVES_CSV).read_bytes()
    (run / CURVES_CSV).write_bytes(data[: len(data) - 200])  # inside bf16-seed1's member
    losses = read_loss_curves(run)
    reference = read_loss_curves(REFERENCE)
    assert losses["bf16-seed0"] == reference["bf16-seed0"]
    assert 0 < len(losses["bf16-seed1"]) < STEPS and losses["bf16-seed1"] == reference["bf16-seed1"][: len(losses["bf16-seed1"])]
    result = _compare(REFERENCE, run)
    assert result.exit_code == 2 and f"holds 40 steps of bf16-seed1, {run / CURVES_CSV} {len(losses['bf16-seed1'])}" in result.output, result.output


def test_a_folder_with_both_curves_files_is_one_line_naming_both_exit_2(tmp_path):
    run = _write(tmp_path / "new", _rows())
    _write(run, _rows(), LEGACY_CURVES_CSV)
    for base, new in ((REFERENCE, run), (run, REFERENCE)):
        result = _compare(base, new)
        assert result.exit_code == 2 and result.output.strip().count("\n") == 0, result.output
        assert result.output.startswith(f"error: {run / CURVES_CSV} and {run / LEGACY_CURVES_CSV}: a run folder holds one curves file"), result.output


@pytest.mark.parametrize("factor", [1.02, 0.98])
def test_a_curve_moved_beyond_the_tolerance_fails_either_way(tmp_path, factor):
    new = _scaled(tmp_path / "new", "bf16-seed1", factor, from_step=31)  # the last quarter only
    result = _compare(REFERENCE, new)
    assert result.exit_code == 1, result.output
    failing = [line for line in result.output.splitlines() if "BEYOND" in line]
    assert len(failing) == 1 and "bf16-seed1" in failing[0] and "step    40" in failing[0], result.output
    assert "FAIL: 1 of 8 checkpoints beyond 1.00%" in result.output
    assert _compare(REFERENCE, new, "--rtol", "0.05").exit_code == 0  # the tolerance is the user's


def test_a_diverged_curve_fails(tmp_path):
    rows = _rows()
    next(row for row in rows[1:] if row[:3] == ["bf16-seed0", "35", "loss"])[5] = "nan"
    result = _compare(REFERENCE, _write(tmp_path / "new", rows))
    assert result.exit_code == 1 and "FAIL: 1 of 9 checkpoints" in result.output, result.output  # step 35: no checkpoint's window
    assert [line for line in result.output.splitlines() if "BEYOND" in line][0].split()[:3] == ["bf16-seed0", "88%", "step"]


def test_a_curve_missing_from_the_new_run_is_incomplete(tmp_path):
    new = _write(tmp_path / "new", [row for row in _rows() if row[0] != "bf16-seed1"])
    result = _compare(REFERENCE, new)
    assert result.exit_code == 5 and "bf16-seed1" in result.output and "INCOMPLETE" in result.output, result.output


def _mutated(mutate) -> list[list[str]] | str:
    return mutate(_rows())


MALFORMED = {
    "another header": (lambda rows: [["curve", "step", "value"], *rows[1:]], "not a curves file"),
    "a step that is no integer": (lambda rows: [*rows[:5], [rows[5][0], "2.5", *rows[5][2:]], *rows[6:]], "line 6: step '2.5' is not a positive integer"),
    "a loss that is no number": (lambda rows: [*rows[:3], [*rows[3][:5], "x1"], *rows[4:]], "line 4: loss 'x1' is not a number"),
    "a row twice": (lambda rows: [*rows[:4], rows[3], *rows[4:]], "line 5: a second 'loss' of 'bf16-seed0' at step 2"),
    "a step left out": (lambda rows: [row for row in rows if row[:3] != ["bf16-seed1", "7", "loss"]], "the loss curve 'bf16-seed1' has no step 7"),
    "no loss curve": (lambda rows: [row for row in rows if row[2] != "loss"], "holds no loss curve"),
    "a short row": (lambda rows: [*rows[:3], rows[3][:4], *rows[4:]], "line 4 has 4 fields, the header 6"),
    "empty": (lambda rows: "", "not a curves file"),
}


# Only a file of one of the two formats can be malformed so.
PLAIN_ONLY = {"torn last line": (lambda rows: (REFERENCE / LEGACY_CURVES_CSV).read_text()[:-9], "last line is torn")}
GZIP_ONLY = {
    "not gzip": (lambda rows: _text(rows).encode(), "not gzip-compressed (Error -3 while decompressing data: incorrect header check)"),
    "cut before its first row ends": (lambda rows: gzip.compress(HEADER.encode(), mtime=0)[:-12], "not one whole row: the gzip member from byte 0 on is cut short"),
    "a whole member without its last line end": (lambda rows: gzip.compress(_text(rows)[:-2].encode(), mtime=0), "its last line has no line end"),
}
CASES = [*((name, LEGACY_CURVES_CSV) for name in [*MALFORMED, *PLAIN_ONLY]), *((name, CURVES_CSV) for name in [*MALFORMED, *GZIP_ONLY])]


@pytest.mark.parametrize(("name", "file"), CASES)
def test_a_malformed_curves_file_is_one_line_naming_it_exit_2(tmp_path, name, file):
    mutate, message = {**MALFORMED, **PLAIN_ONLY, **GZIP_ONLY}[name]
    mutated = mutate(_rows())
    new = tmp_path / "new"
    if isinstance(mutated, bytes):
        new.mkdir()
        (new / file).write_bytes(mutated)
    else:
        _write(new, mutated, file)
    for base, judged in ((REFERENCE, new), (new, REFERENCE)):  # a malformed reference alike
        result = _compare(base, judged)
        assert result.exit_code == 2, (name, result.output)
        assert result.output.strip().splitlines() == [result.output.strip()], result.output
        assert result.output.startswith(f"error: {new / file}: ") and message in result.output, result.output


def test_a_missing_file_and_runs_of_different_lengths_are_usage_errors(tmp_path):
    missing = _compare(REFERENCE, tmp_path / "nothing")
    assert missing.exit_code == 2 and f"{tmp_path / 'nothing'}: no such curves file" in missing.output, missing.output
    shorter = _write(tmp_path / "new", [row for row in _rows() if row[0] == "curve" or int(row[1]) <= 30])
    result = _compare(REFERENCE, shorter)
    assert result.exit_code == 2 and "holds 40 steps of bf16-seed0" in result.output and "compare runs of the same command" in result.output
    assert _compare(REFERENCE, REFERENCE, "--rtol", "-0.1").exit_code == 2
