"""The numerics benchmark's curves and statistics files (fp8bench.harness.curves): gzip-compressed CSV to which
each flush appends a member of its own, read back whole; a last member cut short (a run killed while
appending it) keeps every whole row before the cut and is cut off before a resumed run appends; an older run's
plain curves.csv is read, and converted with its rows unchanged; a folder holding both files is an error."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pandas as pd
import pytest

from fp8bench.benchmarks import numerics
from fp8bench.harness.curves import (
    CURVES_CSV, HEADER, LEGACY_CURVES_CSV, TENSOR_STATS_CSV, Members, convert_legacy_curves, curves_file, read_loss_curves, read_members,
    read_values_text,
)
from fp8bench.harness.validate import MalformedFile, UsageError
from fp8bench.report import numerics as report_numerics

REFERENCE = Path(__file__).parent / "data" / "numerics-loss-tiny"  # a plain curves.csv, as an older fp8bench wrote it


def _write_steps(writer: numerics.CurveWriter, curve: str, steps: range) -> None:
    """Loss 10 - step/10 and gradient norm step/4 at each step, flushed per step as train_curve does."""
    for step in steps:
        writer.write(curve, step, "loss", 10 - step / 10)
        writer.write(curve, step, "grad_norm", step / 4)
        writer.flush()


def _rows(curve: str, steps: range) -> str:
    return "".join(f"{curve},{step},loss,,,{10 - step / 10:.8g}\r\n{curve},{step},grad_norm,,,{step / 4:.8g}\r\n" for step in steps)


def test_each_flush_appends_a_member_and_every_member_reads_back(tmp_path):
    writer = numerics.CurveWriter(tmp_path)
    _write_steps(writer, "bf16-seed0", range(1, 3))
    writer.write_stat("triton-tensorwise-seed0", 2, "amax", 448.0, "blocks.0.qkv", "input")
    writer.write_stat("triton-tensorwise-seed0", 2, "scale", None, "blocks.0.qkv", "input")  # no value: no row
    writer.write("bf16-seed0", 2, "val_loss", 9.75)
    writer.close()
    writer.close()  # nothing left: no member more
    members = [HEADER + _rows("bf16-seed0", range(1, 2)), _rows("bf16-seed0", range(2, 3)), "bf16-seed0,2,val_loss,,,9.75\r\n"]
    assert HEADER == "curve,step,metric,layer,role,value\r\n"
    data = (tmp_path / CURVES_CSV).read_bytes()
    assert data == b"".join(gzip.compress(member.encode(), mtime=0) for member in members)  # one gzip member per flush
    with gzip.open(tmp_path / CURVES_CSV, "rt", newline="") as handle:
        assert handle.read() == "".join(members)  # the gzip module reads the members as one stream
    assert read_members(tmp_path / CURVES_CSV) == Members("".join(members), len(data), "")
    assert read_values_text(tmp_path / TENSOR_STATS_CSV) == HEADER + "triton-tensorwise-seed0,2,amax,blocks.0.qkv,input,448\r\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == [CURVES_CSV, TENSOR_STATS_CSV]
    assert read_loss_curves(tmp_path) == {"bf16-seed0": [9.9, 9.8]}
    frame = report_numerics.read_curves(tmp_path)
    assert list(frame["metric"]) == ["loss", "grad_norm", "loss", "grad_norm", "val_loss", "amax"]
    assert list(frame["value"]) == [9.9, 0.25, 9.8, 0.5, 9.75, 448.0]


def test_a_last_member_cut_short_keeps_every_whole_row_before_the_cut(tmp_path):
    """Cut at every byte of the last member: the members before it whole, then a prefix of its rows."""
    writer = numerics.CurveWriter(tmp_path)
    _write_steps(writer, "bf16-seed0", range(1, 3))
    for step in range(1, 201):  # a member of 400 rows, as a curve joining the run
        writer.write("bf16-seed1", step, "loss", 10 - step / 10)
        writer.write("bf16-seed1", step, "grad_norm", step / 4)
    writer.flush()
    path = tmp_path / CURVES_CSV
    data = path.read_bytes()
    before = HEADER + _rows("bf16-seed0", range(1, 3))
    whole = len(gzip.compress(HEADER.encode() + _rows("bf16-seed0", range(1, 2)).encode(), mtime=0)) + len(
        gzip.compress(_rows("bf16-seed0", range(2, 3)).encode(), mtime=0))
    everything = before + _rows("bf16-seed1", range(1, 201))
    kept = set()
    for end in range(whole + 1, len(data)):
        path.write_bytes(data[:end])
        members = read_members(path)
        assert members.whole == whole and members.cut == f"the gzip member from byte {whole} on is cut short (the run was killed while writing it)"
        assert members.text.startswith(before) and everything.startswith(members.text) and members.text.endswith("\n")
        kept.add(members.text.count("\n"))
    assert min(kept) == 5 and max(kept) == 405  # from none of its rows to all of them (only the CRC and length missing)
    path.write_bytes(data[: len(data) - 8 - 1000])
    losses = read_loss_curves(tmp_path)  # the strict reader keeps them too
    assert losses["bf16-seed0"] == [9.9, 9.8] and losses["bf16-seed1"][:2] == [9.9, 9.8] and 2 < len(losses["bf16-seed1"]) < 200
    assert read_values_text(path) == read_members(path).text


def test_bytes_after_the_whole_members_that_do_not_decompress_end_the_text(tmp_path):
    writer = numerics.CurveWriter(tmp_path)
    _write_steps(writer, "bf16-seed0", range(1, 3))
    path = tmp_path / CURVES_CSV
    whole = path.stat().st_size
    with path.open("ab") as handle:
        handle.write(b"\0\0 not gzip")
    members = read_members(path)
    assert members.text == HEADER + _rows("bf16-seed0", range(1, 3)) and members.whole == whole
    assert members.cut == f"the bytes from {whole} on do not decompress (Error -3 while decompressing data: incorrect header check)"


def test_a_writer_cuts_off_a_member_cut_short_then_appends(tmp_path):
    writer = numerics.CurveWriter(tmp_path)
    _write_steps(writer, "bf16-seed0", range(1, 3))
    path = tmp_path / CURVES_CSV
    whole = path.read_bytes()
    with path.open("ab") as handle:
        handle.write(gzip.compress(_rows("bf16-seed1", range(1, 50)).encode(), mtime=0)[:-20])  # killed while writing it
    assert "bf16-seed1" in read_loss_curves(tmp_path)  # a reader keeps its whole rows
    writer = numerics.CurveWriter(tmp_path)
    assert path.read_bytes() == whole  # the cut member is gone before anything is appended
    _write_steps(writer, "bf16-seed1", range(1, 3))
    assert read_values_text(path) == HEADER + _rows("bf16-seed0", range(1, 3)) + _rows("bf16-seed1", range(1, 3))
    path.write_bytes(gzip.compress(HEADER.encode(), mtime=0)[:12])  # not one row whole: the file goes
    with pytest.raises(MalformedFile, match="not one whole row"):
        read_values_text(path)
    numerics.CurveWriter(tmp_path).close()
    assert not path.exists()


def test_an_older_runs_plain_curves_file_is_read_and_converted_with_its_rows_unchanged(tmp_path):
    shutil.copyfile(REFERENCE / LEGACY_CURVES_CSV, tmp_path / LEGACY_CURVES_CSV)
    assert curves_file(tmp_path) == tmp_path / LEGACY_CURVES_CSV
    losses = read_loss_curves(tmp_path)
    assert list(losses) == ["bf16-seed0", "bf16-seed1"] and len(losses["bf16-seed0"]) == 40
    before = report_numerics.read_curves(tmp_path)
    assert convert_legacy_curves(tmp_path) == tmp_path / CURVES_CSV
    assert sorted(path.name for path in tmp_path.iterdir()) == [CURVES_CSV]
    assert read_values_text(tmp_path / CURVES_CSV) == (REFERENCE / LEGACY_CURVES_CSV).read_bytes().decode()  # the same text, byte for byte
    assert read_members(tmp_path / CURVES_CSV).whole == (tmp_path / CURVES_CSV).stat().st_size  # one whole member
    pd.testing.assert_frame_equal(report_numerics.read_curves(tmp_path), before)
    assert read_loss_curves(tmp_path) == losses
    assert convert_legacy_curves(tmp_path) is None  # nothing plain left


def test_a_torn_plain_file_is_not_converted(tmp_path):
    torn = (REFERENCE / LEGACY_CURVES_CSV).read_bytes()[:-5]
    (tmp_path / LEGACY_CURVES_CSV).write_bytes(torn)
    with pytest.raises(MalformedFile, match=f"{tmp_path / LEGACY_CURVES_CSV}: its last line is torn"):
        numerics.CurveWriter(tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == [LEGACY_CURVES_CSV] and (tmp_path / LEGACY_CURVES_CSV).read_bytes() == torn


def test_a_folder_with_both_curves_files_is_an_error_naming_both(tmp_path):
    shutil.copyfile(REFERENCE / LEGACY_CURVES_CSV, tmp_path / LEGACY_CURVES_CSV)
    (tmp_path / CURVES_CSV).write_bytes(gzip.compress((REFERENCE / LEGACY_CURVES_CSV).read_bytes()))
    message = f"{tmp_path / CURVES_CSV} and {tmp_path / LEGACY_CURVES_CSV}: a run folder holds one curves file"
    for read in (curves_file, read_loss_curves, report_numerics.read_curves, numerics.CurveWriter):
        with pytest.raises(UsageError, match=message):
            read(tmp_path)
