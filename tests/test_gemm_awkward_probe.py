"""tools/gemm_awkward_probe.py's CPU-side summary: each candidate tile's speed over the best of its shape."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

# The tool imports Triton's language module: under the interpreter (no GPU) that must come after TRITON_INTERPRET
# is set, or the kernel tests collected after this file find Triton's own functions compiled for a GPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
spec = importlib.util.spec_from_file_location("gemm_awkward_probe", Path(__file__).parents[1] / "tools/gemm_awkward_probe.py")
probe = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = probe
spec.loader.exec_module(probe)


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
