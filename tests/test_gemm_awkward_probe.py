"""tools/gemm_awkward_probe.py's CPU-side summary: each candidate tile's speed over the best of its shape; and
gemm_sweep's ranking of tiles, which the probe imports with it."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from tool_module import load_tool

probe = load_tool("gemm_awkward_probe", triton_kernels=True)


def test_tile_speeds_keep_the_overlapped_and_plain_tile_apart_and_skip_unfilled_grids():
    regime = "blockwise/fast_accum=off"
    rows = [  # (shape, config, grid fill, ratio)
        ("a", "128x128x128 s4 w8 g8 gluon-ws", 1.0, 0.90),
        ("a", "128x128x128 s4 w8 g8 gluon-ws overlapped", 1.0, 0.96),
        ("a", "192x128x128 s3 w8 g8 gluon-ws", 1.0, 0.96),
        ("b", "128x128x128 s4 w8 g8 gluon-ws last-wave 20x2", 0.97, 0.80),
        ("b", "128x128x128 s4 w8 g8 gluon-ws overlapped last-wave 20x2", 0.97, 1.00),
        ("b", "192x128x128 s3 w8 g8 gluon-ws", 0.50, 0.70),  # its grid is half idle: not its speed
    ]
    frame = pd.DataFrame(rows, columns=["shape", "config", "grid_fill", "ratio"]).assign(regime=regime)
    frame["best_ratio"] = frame.groupby("shape")["ratio"].transform("max")
    speeds = probe.tile_speeds(frame).set_index("tile")
    assert speeds.loc["128x128x128 s4", "speed"] == pytest.approx((0.90 / 0.96 * 0.80 / 1.00) ** 0.5)
    assert speeds.loc["128x128x128 s4 overlapped", "speed"] == pytest.approx(1.0)
    assert speeds.loc["192x128x128 s3", "shapes"] == 1 and speeds.loc["192x128x128 s3", "speed"] == pytest.approx(1.0)
    assert set(speeds.regime) == {regime}


def test_gemm_sweep_ranks_a_tile_across_shapes_whatever_its_last_wave_split():
    """The heuristic sizes the last wave's split per shape: the ranking still sees one tile timed on every shape."""
    import gemm_sweep

    regime = "blockwise-1x128/fast_accum=off"
    frame = pd.DataFrame.from_records([  # (shape, tile, its config on that shape, ratio)
        dict(shape=shape, regime=regime, backend="triton", tile=tile, config=config, ratio=ratio, tflops=900.0)
        for shape, tile, config, ratio in [
            ("a", "128x128x128 s4 w8 g8 gluon-ws overlapped", "128x128x128 s4 w8 g8 gluon-ws overlapped", 0.99),
            ("b", "128x128x128 s4 w8 g8 gluon-ws overlapped", "128x128x128 s4 w8 g8 gluon-ws overlapped last-wave 4x5", 0.96),
            ("a", "128x64x128 s4 w8 g8 gluon-ws", "128x64x128 s4 w8 g8 gluon-ws", 0.72),
            ("b", "128x64x128 s4 w8 g8 gluon-ws", "128x64x128 s4 w8 g8 gluon-ws last-wave 8x5", 0.75),
            ("a", "128x128x128 s4 w8 g8 gluon-ws", "128x128x128 s4 w8 g8 gluon-ws", 0.92),  # timed on one shape only
        ]
    ] + [dict(shape="a", regime=regime, backend="cublas", tile="", config="", ratio=None, tflops=950.0)])
    ranked = gemm_sweep._rank(frame, regime)
    assert list(ranked.index) == ["128x128x128 s4 w8 g8 gluon-ws overlapped", "128x64x128 s4 w8 g8 gluon-ws"]
    assert ranked.geomean_ratio.iloc[0] == pytest.approx((0.99 * 0.96) ** 0.5)
    assert ranked.min_ratio.iloc[1] == pytest.approx(0.72)


def test_a_candidate_variant_runs_and_reports_its_split_with_its_constants_in_place():
    """`gemm_sweep.py compare --candidate PARTIAL_SUM_K_TILES=8`: the variant's last-wave split is sized at launch, so
    its options (and its runs) see the changed constant; outside it, the heuristic's constant is back."""
    import gemm_sweep
    from fp8kernels import gemm_configs
    from fp8kernels.gemm_configs import DeviceProperties, choose_config
    from fp8kernels.scaling import Granularity

    from gemm_sweep import GemmShape, Variant

    shape = GemmShape(16384, 16384, 16384)
    config = choose_config(shape.M, shape.N, shape.K, Granularity.TENSORWISE, True, DeviceProperties(132, 232448), True)
    before = gemm_configs.PARTIAL_SUM_K_TILES
    _, plain = gemm_sweep.SideBySide._ours(shape, None, Granularity.TENSORWISE, True, Variant(config))
    _, variant = gemm_sweep.SideBySide._ours(shape, None, Granularity.TENSORWISE, True,
                                             Variant(config, "PARTIAL_SUM_K_TILES=8", (("PARTIAL_SUM_K_TILES", 8.0),)))
    assert (plain["split_tiles"], plain["splits"]) == (8, 8) and "variant" not in plain
    assert (variant["split_tiles"], variant["splits"]) == (8, 4) and variant["variant"] == "PARTIAL_SUM_K_TILES=8"
    assert gemm_configs.PARTIAL_SUM_K_TILES == before
    assert gemm_configs.last_wave_split(shape.M, shape.N, shape.K, config) == (8, 8)


def test_variant_gains_are_the_picks_time_over_the_variants(capsys):
    """Gain above 1: the variant ran faster; the per-regime geomean takes the variant's ratio where it has one."""
    import gemm_sweep

    regime = "tensorwise/fast_accum=on"
    per_shape = pd.DataFrame([dict(shape=s, regime=regime, config=f"pick {s}", ratio=r) for s, r in (("a", 0.8), ("b", 1.0))])
    twins = pd.DataFrame([dict(shape="a", regime=regime, config="other", ratio=0.9)])
    gemm_sweep._print_variant_gains(per_shape, twins, "X=1", "the heuristic with X=1")
    printed = capsys.readouterr().out
    assert "1.125" in printed  # 0.9 / 0.8
    assert f"{(0.9 * 1.0) ** 0.5:.3f}" in printed and f"{(0.8 * 1.0) ** 0.5:.3f}" in printed
    gemm_sweep._print_variant_gains(per_shape, twins.iloc[:0], "X=1", "nothing timed")
    assert capsys.readouterr().out == ""


def test_compare_takes_target_shapes_by_name_and_products_of_ones_own():
    import typer

    import gemm_sweep

    assert len(gemm_sweep.compared_shapes([])) == 27
    named, own = gemm_sweep.compared_shapes(["llama3-70b-tp8.wqkv.M8192", "4096x7168x2112"])
    assert (named.M, named.K, named.N) == (8192, 8192, 1280)
    assert (own.M, own.K, own.N) == (4096, 7168, 2112)
    with pytest.raises(typer.BadParameter, match="not target shapes nor MxKxN products: no-such, 4096x7168"):
        gemm_sweep.compared_shapes(["no-such", "4096x7168", "8192x8192x8192"])
    assert gemm_sweep.parse_regime("blockwise/fast_accum=off") == (gemm_sweep.Granularity.BLOCKWISE, False)
    with pytest.raises(typer.BadParameter, match="unknown regime 'blockwise/fast_accum=on'"):
        gemm_sweep.parse_regime("blockwise/fast_accum=on")


def test_the_summary_is_rewritten_whole_after_each_comparison(tmp_path):
    """compare's summary.csv, rewritten atomically after each comparison: a run stopped by a time limit keeps the
    comparisons it finished, and no partial file is left beside it."""
    import gemm_sweep

    path = tmp_path / "summary.csv"
    rows = [dict(shape="a", regime="tensorwise/fast_accum=on", backend="cublas", ms=1.0)]
    gemm_sweep.write_summary(pd.DataFrame(rows), path)
    rows.append(dict(shape="a", regime="tensorwise/fast_accum=on", backend="triton", ms=0.9))
    gemm_sweep.write_summary(pd.DataFrame(rows), path)
    written = pd.read_csv(path)
    assert list(written.backend) == ["cublas", "triton"] and written.ms.tolist() == [1.0, 0.9]
    assert [p.name for p in tmp_path.iterdir()] == ["summary.csv"]
