"""tools/gemm_host_probe.py's CPU side: the parts of a call from its marks, and a clear exit without a GPU."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner
from tool_module import load_tool

probe = load_tool("gemm_host_probe")


def test_the_parts_are_the_spans_between_the_marks_of_one_call():
    clock = probe.PartClock()
    start = clock.start()
    clock.marks.update(launch_kernel=start + 12e-6, kernel=start + 30e-6, launched=start + 100e-6)
    parts = clock.parts(start)
    assert parts == pytest.approx({"ours_checks": 12.0, "ours_prepare": 18.0, "ours_launch": 70.0})
    # A call that did not reach the Gluon kernel has no parts, and marks do not outlive the call they were taken in.
    start = clock.start()
    clock.mark("launch_kernel")
    assert clock.parts(start) == {}
    assert probe.medians({"ours": [3.0, 1.0, 2.0], "ours_launch": []}) == {"ours": 2.0, "ours_launch": None}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU exit")
def test_without_a_gpu_it_says_so_and_exits_2():
    result = CliRunner().invoke(probe.app, [])
    assert result.exit_code == 2 and "needs a CUDA GPU" in result.output


def test_a_shape_not_written_mxkxn_exits_2_naming_it():
    result = CliRunner().invoke(probe.app, ["--shape", "512x4096"])
    assert result.exit_code == 2 and "'512x4096' is not MxKxN" in result.output
