"""tools/gemm_heuristic_grade.py: the heuristic's pick graded against a tuner cache's timed candidates, offline."""

from __future__ import annotations

import dataclasses

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


def test_a_changed_tile_speed_is_graded_beside_the_heuristic_and_undone(tmp_path):
    """With 128 x 128 at half its speed, and no product short enough to trade a split for its five-stage ring, the fast
    regime's pick for M 512, N 4096, K 14336 is 128 x 256 split in two: a candidate this cache did not time, so it
    counts apart; the picks it alters over the shape sets are counted; and the heuristic is the same afterwards."""
    pick = choose_config(512, 4096, 14336, Granularity.TENSORWISE, True, H100, True, 128)
    result = CliRunner().invoke(tool.app, [str(_cache(tmp_path, 0.05, 0.04)), "--set", "fast.NARROW_GLUON=0.5",
                                           "--set", "DEEP_NARROW_MAX_MACS=1"])
    assert result.exit_code == 0, result.output
    assert ("with fast.NARROW_GLUON=0.5, DEEP_NARROW_MAX_MACS=1: no problem graded (2 whose pick was not timed)"
            in " ".join(result.output.split()))
    assert "picks the change alters over fp8bench's shape sets:" in result.output
    assert choose_config(512, 4096, 14336, Granularity.TENSORWISE, True, H100, True, 128) == pick
    from fp8kernels import gemm_configs

    hand_over = gemm_configs.PARTIAL_SUM_K_TILES
    with tool.changed([tool.parse_setting("fast.NARROW_GLUON=0.5"), tool.parse_setting("DEEP_NARROW_MAX_MACS=1")]):
        assert choose_config(512, 4096, 14336, Granularity.TENSORWISE, True, H100, True, 128).block_n == 256
    with tool.changed([tool.parse_setting("PARTIAL_SUM_K_TILES=3")]):
        assert gemm_configs.PARTIAL_SUM_K_TILES == 3 and isinstance(gemm_configs.PARTIAL_SUM_K_TILES, int)
    assert gemm_configs.PARTIAL_SUM_K_TILES == hand_over


@pytest.mark.parametrize("setting, message", [
    ("PARTIAL_SUM_K_TILES", "expected NAME=NUMBER"),
    ("SLIM_SPEED=0.8", "a constant of PARTIAL_SUM_K_TILES"),
    ("quick.WIDE_GLUON=1", "no regime 'quick'"),
    ("blockwise.WIDE_GLUON=1", "blockwise's tiles are TALL_BLOCKWISE_GLUON"),
])
def test_a_setting_it_cannot_apply_exits_2_naming_what_it_can(tmp_path, setting, message):
    result = CliRunner().invoke(tool.app, [str(_cache(tmp_path, 0.05, 0.04)), "--set", setting])
    assert result.exit_code == 2 and message in " ".join(result.output.split())


def test_splits_set_the_models_gain_beside_the_measured_one(tmp_path):
    """N 1040 at M 4096, K 4096 in 192 x 128 tiles: 198 tiles, 1.5 waves; its last 66 split in two take the busiest
    program from 64 K-tiles to 32 + 16 + the hand-over's PARTIAL_SUM_K_TILES x 2. The tuner timed the split slower."""
    from fp8kernels import gemm_configs

    cache = TuneCache(tmp_path / "gemm-test.json")
    key = problem_key(4096, 1040, 4096, Granularity.TENSORWISE, True, 128, torch.float8_e4m3fn, torch.float8_e4m3fn)
    # The 192-row tile with three stages, whose last wave splits, and with four, unsplit (DEEP_TALL_STAGES), timed
    # beside them as the tuner's pick.
    heuristic = dataclasses.replace(gemm_configs.TALL_GLUON.with_sms(132), num_stages=4, split_last_wave=False, group_m=1)
    pick = dataclasses.replace(heuristic, num_stages=3, split_last_wave=True)
    whole = config_label(pick.as_dict())
    assert whole.startswith("192x128x128 s3 w8")
    composite = choose_config(4096, 1040, 4096, Granularity.TENSORWISE, True, H100, True, 128)  # the heuristic's pick
    cache.store(key, heuristic, {whole: 0.0378, whole + " last-wave 66x2": 0.0447,
                                 "128x256x128 s3 w8 g16 gluon-ws": 0.0437, config_label(heuristic.as_dict()): 0.0335,
                                 config_label(composite.as_dict()): 0.0272})
    (record,) = tool.split_pairs(cache.read(), 132)
    assert record["tile"] == whole and record["split"] == "66x2" and record["waves"] == pytest.approx(1.5)
    assert record["model_gain"] == pytest.approx(64 / (32 + 16 + 2 * gemm_configs.PARTIAL_SUM_K_TILES))
    assert record["measured_gain"] == pytest.approx(0.0378 / 0.0447)
    result = CliRunner().invoke(tool.app, [str(cache.path), "--splits"])
    assert result.exit_code == 0 and "1-2 waves: 1 splits, measured gain 0.846 geomean" in result.output
    model_gain = 64 / (32 + 16 + 2 * gemm_configs.PARTIAL_SUM_K_TILES)
    assert f"from one wave, K 2049-4096: 1 splits, measured over the model's gain {0.0378 / 0.0447 / model_gain:.3f} geomean" in result.output
