"""tools/gemm_profile.py's CPU side: reading ncu's exported counters and SASS samples, and clear exits on bad input."""

from __future__ import annotations

import csv
import gzip
import json
import subprocess
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner
from tool_module import load_tool

from fp8bench.harness import env

profile = load_tool("gemm_profile")


def write_raw(path, kernel: str, duration_us: float, tensor_pct: float, barrier_stall: float, duration_unit: str = "us") -> None:
    """A raw page as `ncu --page raw --csv` exports it: names, units, one kernel's values (thousands with commas), the
    duration in `duration_unit` (ncu's choice by size)."""
    duration = duration_us / {"us": 1.0, "ms": 1e3}[duration_unit]
    names = ["ID", "Kernel Name", "gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second",
             "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
             "launch__grid_size", "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
             "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"]
    with path.open("w", newline="") as f:
        out = csv.writer(f, quoting=csv.QUOTE_ALL)
        out.writerows([names, ["", "", duration_unit, "Ghz", "%", "", "", ""],
                       ["0", kernel, f"{duration:,.6f}", "1.4", str(tensor_pct), "132", str(barrier_stall), "0.5"]])


def write_sass(path, instructions: list[tuple[str, int, int]]) -> None:
    """A source page as `ncu --page source --csv --print-source sass` exports it: (SASS, times executed, samples)."""
    names = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_barrier",
             "stall_selected", "stall_barrier (Not Issued)"]
    with path.open("w", newline="") as f:
        out = csv.writer(f, quoting=csv.QUOTE_ALL)
        out.writerow(["Kernel Name", "k"])
        out.writerow(names)
        for i, (source, executed, samples) in enumerate(instructions):
            out.writerow([f"{0x7f0000 + 16 * i:#x}", source, samples, executed, samples - samples // 4, samples // 4,
                          samples])


def test_counters_and_stalls_are_read_by_name(tmp_path):
    write_raw(tmp_path / "ours.raw.csv", "_fp8_gemm_ws_kernel", 1803.07, 79.5, 3.94)
    counters = profile.read_counters(tmp_path / "ours.raw.csv")
    assert counters.kernel == "_fp8_gemm_ws_kernel"
    assert counters.values["duration_us"] == pytest.approx(1803.07)
    assert counters.values["sm_kilocycles"] == pytest.approx(1803.07 * 1.4)  # duration x clock: compares across runs
    assert counters.values["tensor_pipe_pct"] == pytest.approx(79.5) and counters.values["grid"] == 132
    assert "l2_pct" not in counters.values  # a counter the export lacks is left out, not zero
    assert counters.stalls == {"barrier": pytest.approx(3.94), "wait": pytest.approx(0.5)}


def test_l2_traffic_is_read_in_megabytes_from_bytes_and_32_byte_sectors(tmp_path):
    """The bytes the SMs received, and L2's read and fabric sectors, as ncu gives them (M 1024, K 16384, N 1024 on an
    H200), all in MB, and the SMs each sector reached; a byte counter in a unit ncu does not use exits 2 naming it."""
    names = ["ID", "Kernel Name", "l1tex__m_xbar2l1tex_read_bytes.sum", "lts__t_sectors_srcunit_tex_op_read.sum",
             "lts__t_sectors_srcunit_ltcfabric.sum", "lrc__average_xbar2gpc_sectors_op_read.ratio"]
    path = tmp_path / "cublas.raw.csv"
    with path.open("w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows(
            [names, ["", "", "Mbyte", "sector", "sector", ""],
             ["0", "nvjet", "402.661376", "5,288,592", "831,940", "2.24"]])
    values = profile.read_counters(path).values
    assert values["sm_received_mb"] == pytest.approx(402.661376)
    assert values["l2_read_mb"] == pytest.approx(5_288_592 * 32 / 1e6)
    assert values["l2_fabric_mb"] == pytest.approx(831_940 * 32 / 1e6)
    assert values["l2_sector_fanout"] == pytest.approx(2.24)
    with path.open("w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows(
            [names, ["", "", "words", "sector", "sector", ""],
             ["0", "nvjet", "402.661376", "5,288,592", "831,940", "2.24"]])
    with pytest.raises(profile.ProfileError, match=r"cublas\.raw\.csv: l1tex__m_xbar2l1tex_read_bytes\.sum in 'words'"):
        profile.read_counters(path)


def test_durations_in_milliseconds_are_read_in_microseconds(tmp_path):
    """ncu gives a kernel of 1.7 ms its duration in ms: the table, and the cycles from it, stay in us."""
    write_raw(tmp_path / "ours.raw.csv", "_fp8_gemm_ws_kernel", 1733.952, 37.2, 5.46, duration_unit="ms")
    counters = profile.read_counters(tmp_path / "ours.raw.csv")
    assert counters.values["duration_us"] == pytest.approx(1733.952)
    assert counters.values["sm_kilocycles"] == pytest.approx(1733.952 * 1.4)


def test_a_duration_in_a_unit_ncu_does_not_use_exits_2_naming_the_file(tmp_path):
    write_raw(tmp_path / "ours.raw.csv", "_fp8_gemm_ws_kernel", 800.0, 80.0, 1.0)
    text = (tmp_path / "ours.raw.csv").read_text().replace('"us"', '"fortnight"')
    (tmp_path / "ours.raw.csv").write_text(text)
    write_raw(tmp_path / "cublas.raw.csv", "nvjet_sm90", 790.0, 81.0, 1.2)
    result = CliRunner().invoke(profile.app, ["summarize", str(tmp_path)])
    assert result.exit_code == 2
    assert "ours.raw.csv" in result.output and "fortnight" in result.output


def test_hot_runs_group_equally_executed_instructions_and_drop_the_cold(tmp_path):
    loop = [("QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], RZ", 600, 40), ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 600, 300)]
    loop += [(f"FFMA R{i}, R{i + 64}, R150, R{i}", 600, 5) for i in range(64)]
    write_sass(tmp_path / "ours.sass.csv", [("LDC R1, c[0x0][0x28]", 132, 2)] + loop + [("EXIT", 132, 1),
                                                                                       ("BAR.SYNC 0x1", 4, 60)])
    runs = profile.read_hot_runs(tmp_path / "ours.sass.csv")
    total = 2 + 40 + 300 + 64 * 5 + 1 + 60
    assert [r.first for r in runs] == ["+0x10", "+0x440"]  # the loop, then the barrier; the LDC and EXIT are under 2%
    body, barrier = runs
    assert (body.instructions, body.executed, body.qgmma, body.ffma, body.barriers) == (66, 600, 1, 64, 1)
    assert body.share == pytest.approx((40 + 300 + 320) / total)
    # Each instruction's samples split 3:1 (rounded down) between barrier and selected; the run's shares sum them.
    assert body.stalls == {"barrier": pytest.approx((30 + 225 + 64 * 4) / 660), "selected": pytest.approx((10 + 75 + 64) / 660)}
    assert barrier.barriers == 1 and barrier.share == pytest.approx(60 / total)


def test_summarize_prints_both_backends_side_by_side(tmp_path):
    write_raw(tmp_path / "ours.raw.csv", "_fp8_gemm_ws_kernel", 803.1, 79.5, 3.94)
    write_raw(tmp_path / "cublas.raw.csv", "nvjet_sm90_qqtst_128x128", 776.3, 81.0, 1.21)
    for backend in ("ours", "cublas"):
        write_sass(tmp_path / f"{backend}.sass.csv", [("FFMA R1, R2, R3, R1", 10, 50)])
    result = CliRunner().invoke(profile.app, ["summarize", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "nvjet_sm90_qqtst_128x128" in result.output and "776.3" in result.output and "803.1" in result.output
    assert "stall barrier" in result.output and "3.94" in result.output and "1.21" in result.output


def test_folders_compared_side_by_side_under_their_names(tmp_path):
    for name, duration in (("before", 831.9), ("after", 796.5)):
        (tmp_path / name).mkdir()
        write_raw(tmp_path / name / "ours.raw.csv", "_fp8_gemm_ws_kernel", duration, 80.0, 3.9)
    result = CliRunner().invoke(profile.app, ["summarize", str(tmp_path / "before"), str(tmp_path / "after")])
    assert result.exit_code == 0, result.output
    assert "before: ours" in result.output and "after: ours" in result.output
    assert "1165" in result.output and "1115" in result.output  # SM kilocycles at 1.4 GHz: 831.9 and 796.5 us
    (tmp_path / "again" / "before").mkdir(parents=True)
    write_raw(tmp_path / "again" / "before" / "ours.raw.csv", "_fp8_gemm_ws_kernel", 700.0, 80.0, 3.9)
    result = CliRunner().invoke(profile.app, ["summarize", str(tmp_path / "before"), str(tmp_path / "again" / "before")],
                                terminal_width=400)
    assert result.exit_code == 0 and "980" in result.output and "1165" in result.output  # both kept: names told apart
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(profile.app, ["summarize", str(tmp_path / "before"), str(tmp_path / "empty")])
    assert result.exit_code == 2 and "empty: no <backend>.raw.csv(.gz) to summarize" in result.output


def test_exports_kept_gzipped_read_as_written(tmp_path):
    write_raw(tmp_path / "ours.raw.csv", "_fp8_gemm_ws_kernel", 803.1, 79.5, 3.94)
    write_sass(tmp_path / "ours.sass.csv", [("FFMA R1, R2, R3.reuse, R1", 10, 50)])
    plain = CliRunner().invoke(profile.app, ["summarize", str(tmp_path)])
    for name in ("ours.raw.csv", "ours.sass.csv"):
        (tmp_path / f"{name}.gz").write_bytes(gzip.compress((tmp_path / name).read_bytes()))
        (tmp_path / name).unlink()
    zipped = CliRunner().invoke(profile.app, ["summarize", str(tmp_path)])
    assert zipped.exit_code == plain.exit_code == 0 and "803.1" in zipped.output and "+0x0" in zipped.output
    (tmp_path / "ours.sass.csv.gz").write_bytes(b"not gzip")
    result = CliRunner().invoke(profile.app, ["summarize", str(tmp_path)])
    assert result.exit_code == 2 and "ours.sass.csv.gz: cannot read" in result.output


def test_a_malformed_export_exits_2_naming_the_file(tmp_path):
    (tmp_path / "ours.raw.csv").write_text("not,counters\n")
    result = CliRunner().invoke(profile.app, ["summarize", str(tmp_path)])
    assert result.exit_code == 2 and "ours.raw.csv: not ncu's raw counters" in result.output
    write_raw(tmp_path / "ours.raw.csv", "k", 1.0, 1.0, 1.0)
    (tmp_path / "ours.sass.csv").write_text("Address,Source\n")
    result = CliRunner().invoke(profile.app, ["summarize", str(tmp_path)])
    assert result.exit_code == 2 and "ours.sass.csv: not ncu's SASS source page" in result.output


def test_a_folder_without_exports_exits_2(tmp_path):
    result = CliRunner().invoke(profile.app, ["summarize", str(tmp_path)])
    assert result.exit_code == 2 and "no <backend>.raw.csv(.gz) to summarize" in result.output


def test_a_bad_shape_or_regime_exits_2_before_profiling(tmp_path):
    result = CliRunner().invoke(profile.app, ["run", "--shape", "4096x7168", "--regime", "blockwise/fast_accum=off",
                                              "--out", str(tmp_path)])
    assert result.exit_code == 2 and "'4096x7168' is not MxKxN" in result.output
    result = CliRunner().invoke(profile.app, ["run", "--shape", "4096x7168x2048", "--regime", "blockwise",
                                              "--out", str(tmp_path)])
    assert result.exit_code == 2 and "unknown regime 'blockwise'" in result.output
    assert not any(tmp_path.iterdir())


def test_run_profiles_each_backend_exports_its_counters_and_prints_them(tmp_path, monkeypatch):
    """`run` end to end with ncu stood in for: one profile and two exports per backend, then the tables."""
    exports = {}
    for backend, duration in (("ours", 796.5), ("cublas", 783.6)):
        write_raw(tmp_path / f"{backend}.raw", "_fp8_gemm_ws_kernel" if backend == "ours" else "nvjet_sm90", duration, 83.2, 1.0)
        write_sass(tmp_path / f"{backend}.sass", [("FFMA R1, R2, R3.reuse, R1", 10, 50)])
        exports[backend] = {"raw": (tmp_path / f"{backend}.raw").read_text(), "source": (tmp_path / f"{backend}.sass").read_text()}
    calls = []
    real_run = subprocess.run

    def fake_run(command, **kwargs):
        if command[0] != "/opt/ncu":  # git, for the run's metadata
            return real_run(command, **kwargs)
        calls.append(command)
        if command[1:] == ["--version"]:
            return subprocess.CompletedProcess(command, 0, "NVIDIA (R) Nsight Compute\nVersion 2025.3.1.0\n", "")
        if "--import" in command:
            report = Path(command[command.index("--import") + 1])
            return subprocess.CompletedProcess(command, 0, exports[report.stem][command[command.index("--page") + 1]], "")
        Path(command[command.index("-o") + 1] + ".ncu-rep").write_bytes(b"report")
        return subprocess.CompletedProcess(command, 0, "==PROF== done", "")

    monkeypatch.setattr(profile.subprocess, "run", fake_run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(env, "gpu_metadata", lambda: {"gpu_name": "NVIDIA H100 80GB HBM3"})
    monkeypatch.setattr(profile, "_ncu_path", lambda given: "/opt/ncu")
    out = tmp_path / "profile"
    result = CliRunner().invoke(profile.app, ["run", "--shape", "4096x16384x7168", "--regime", "blockwise/fast_accum=off",
                                              "--out", str(out)], terminal_width=300)
    assert result.exit_code == 0, result.output
    profiled = [c for c in calls if "-o" in c]
    assert [c[c.index("-k") + 1] for c in profiled] == ["regex:_fp8_gemm", "regex:nvjet|sm90_xmma|cutlass"]
    assert all(c[c.index("--launch-skip") + 1] == "2" for c in profiled)  # the third call, after compile and warm-up
    assert {p.name for p in out.iterdir()} >= {"ours.raw.csv", "ours.sass.csv", "cublas.raw.csv", "cublas.sass.csv",
                                                "metadata.json", "ours.ncu.log"}
    assert "796.5" in result.output and "783.6" in result.output and "ours: instruction runs" in result.output
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["ncu"] == "Version 2025.3.1.0" and metadata["regime"] == "blockwise/fast_accum=off"
    # ncu locks the clock near base unless --own-clock leaves it to the GPU, as in a timed run; the metadata says which.
    assert all(c[c.index("--clock-control") + 1] == "base" for c in profiled)
    assert metadata["ncu_clock_control"] == "base"
    calls.clear()
    result = CliRunner().invoke(profile.app, ["run", "--shape", "4096x16384x7168", "--regime",
                                              "blockwise/fast_accum=off", "--out", str(out), "--own-clock"],
                                terminal_width=300)
    assert result.exit_code == 0, result.output
    assert [c[c.index("--clock-control") + 1] for c in calls if "-o" in c] == ["none", "none"]
    assert json.loads((out / "metadata.json").read_text())["ncu_clock_control"] == "none"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU exit")
def test_without_a_gpu_run_says_so_and_exits_2(tmp_path):
    result = CliRunner().invoke(profile.app, ["run", "--shape", "4096x7168x2048", "--regime", "blockwise/fast_accum=off",
                                              "--out", str(tmp_path)])
    assert result.exit_code == 2 and "needs a CUDA GPU" in result.output
