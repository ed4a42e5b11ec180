"""tools/gemm_heuristic_grade.py: the heuristic's pick graded against a tuner cache's timed candidates, offline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner
from tool_module import load_tool

tool = load_tool("gemm_heuristic_grade", triton_kernels=True)

from fp8kernels.gemm_autotune import TuneCache, problem_key  # noqa: E402
from fp8kernels.gemm_configs import DeviceProperties, choose_config, config_label  # noqa: E402
from fp8kernels.scaling import Granularity  # noqa: E402

H100 = DeviceProperties(132, 232448)


def _cache(tmp_path, pick_ms: float, other_ms: float) -> Path:
    """Two problems: one whose candidates include the heuristic's pick (at pick_ms, beside another at other_ms),
    one whose candidates do not."""
    cache = TuneCache(tmp_path / "gemm-test.json")
    pick = choose_config(512, 4096, 14336, Granularity.TENSORWISE, True, H100, True, 128)
    key = problem_key(512, 4096, 14336, Granularity.TENSORWISE, True, 128, torch.float8_e4m3fn, torch.float8_e4m3fn)
    cache.store(key, pick, {config_label(pick.options_for(512, 4096, 14336)): pick_ms, "another tile": other_ms})
    untimed = problem_key(256, 4096, 7168, Granularity.AXISWISE, False, 128, torch.float8_e4m3fn, torch.float8_e4m3fn)
    cache.store(untimed, pick, {"a tile the heuristic does not take": 1.0})
    return cache.path


def test_the_pick_is_graded_against_the_fastest_candidate(tmp_path):
    graded, untimed = tool.grade(TuneCache(_cache(tmp_path, 0.05, 0.04)).read(), 132, 232448)
    assert [ratio for _, _, ratio in graded] == [pytest.approx(1.25)] and len(untimed) == 1
    graded, _ = tool.grade(TuneCache(_cache(tmp_path, 0.03, 0.04)).read(), 132, 232448)
    assert graded[0][2] == 1.0


def test_the_cli_prints_the_geomean_and_exits_2_on_a_malformed_cache(tmp_path):
    result = CliRunner().invoke(tool.app, [str(_cache(tmp_path, 0.05, 0.04))])
    assert result.exit_code == 0, result.output
    assert "1 problems: the heuristic's pick takes 1.2500x" in result.output and "1 problems' picks were not timed" in result.output
    (tmp_path / "bad.json").write_text("[1, 2]")
    bad = CliRunner().invoke(tool.app, [str(tmp_path / "bad.json")])
    assert bad.exit_code == 2 and "bad.json" in bad.output
