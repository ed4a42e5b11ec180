"""The numerics page's conclusions are written from the run's numbers: a run folder made here with known
curves (no training) and the sentences checked against the numbers pandas computes from the same files."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import pytest

from fp8bench.benchmarks import numerics
from fp8bench.harness.results import RunWriter, load_results
from fp8bench.nn.recipes import RECIPES
from fp8bench.report import numerics as report_numerics

STEPS = 40
CONFIG = numerics.TrainConfig(steps=STEPS, device="cpu")


def _loss_run(run_dir, fp8_gaps: dict[str, np.ndarray], statuses: dict[str, str] | None = None) -> None:
    """BF16 seed 0 at a falling loss, seed 1 0.2% above it, and each FP8 curve at its per-step relative gap."""
    statuses = statuses or {}
    reference = 3.0 - np.linspace(0.0, 1.0, STEPS)
    losses = {"bf16-seed0": reference, "bf16-seed1": reference * 1.002, **{name: reference * (1 + gap) for name, gap in fp8_gaps.items()}}
    writer = numerics.CurveWriter(run_dir)
    for name, values in losses.items():
        for step, value in enumerate(values, 1):
            writer.write(name, step, "loss", float(value))
    writer.close()
    curves = [numerics.Curve("bf16-seed0"), numerics.Curve("bf16-seed1", seed=1)]
    curves += [numerics.Curve(name, RECIPES[name.split("-", 1)[1].rsplit("-seed", 1)[0]]) for name in fp8_gaps]
    curves += [numerics.Curve(name, RECIPES["blockwise"], implementation="torchao") for name in statuses]
    with RunWriter(run_dir, {"benchmark": "numerics"}) as results:
        for curve in curves:
            status = statuses.get(curve.name, "ok")
            gap = None if curve.name in statuses else numerics.relative_gap(list(losses[curve.name]), list(reference))
            results.append(numerics._row("loss", curve, CONFIG, "synthetic", status, {"rel_err": gap}))


def test_loss_conclusion_counts_gaps_and_says_when_each_settles(tmp_path):
    settling = np.where(np.arange(1, STEPS + 1) <= 10, 0.05, 0.001)  # 5% for ten steps, then 0.1%
    _loss_run(tmp_path, {"triton-tensorwise-seed0": settling, "triton-rowwise-seed0": np.full(STEPS, 0.03)},
              {"torchao-blockwise-seed0": "unsupported: torchao has no blockwise recipe"})  # fmt: skip
    rows = load_results(tmp_path)
    curves = report_numerics.read_curves(tmp_path)
    text = report_numerics.loss_conclusion(report_numerics.headline(rows, curves), curves)
    loss = curves[curves.metric == "loss"].pivot(index="step", columns="curve", values="value")
    means = loss.apply(report_numerics.trailing_means)
    gap = means.div(means["bf16-seed0"], axis=0) - 1
    assert text.startswith("1 of the 2 FP8 curves that ran end within 1% of bf16-seed0's loss over the last 10% of steps (BF16 noise ±0.20%)")
    assert f"the largest gap is triton-rowwise-seed0's, {100 * gap['triton-rowwise-seed0'].iloc[-1]:+.2f}%." in text
    # The trailing mean (last 10% of the steps so far) of the settling curve falls within 1% at the first step after it stops being outside.
    outside = gap["triton-tensorwise-seed0"].abs() > 0.01
    assert f"stays within 1% for good: triton-tensorwise-seed0 from step {outside[outside].index.max() + 1}." in text
    assert "Still outside 1% at the last step: triton-rowwise-seed0." in text
    assert text.endswith("Not run: torchao-blockwise-seed0 (unsupported: torchao has no blockwise recipe).")
    page = "".join(report_numerics.sections(tmp_path, rows))
    assert f'<p class="conclusion">{html.escape(text)}</p>' in page


def test_stats_conclusion_names_the_worst_role_layer_and_step(tmp_path):
    writer = numerics.CurveWriter(tmp_path)
    for step in (1, 2, 3):
        for layer in ("layers.0.attention.wqkv", "layers.0.feed_forward.w2"):
            writer.write_stat("triton-tensorwise-seed0", step, "underflow_pct", 0.5 * step, layer, "input")
            writer.write_stat("triton-tensorwise-seed0", step, "underflow_pct", 4.0 if (step, layer) == (2, "layers.0.feed_forward.w2") else 1.0,
                              layer, "grad_output")  # fmt: skip
            writer.write_stat("triton-tensorwise-seed0", step, "saturate_pct", 0.0, layer, "input")
            writer.write_stat("triton-tensorwise-seed0", step, "sqnr_db", 30.0 + step, layer, "output")
    writer.close()
    curves = report_numerics.read_curves(tmp_path)
    text = report_numerics.stats_conclusion(curves, {"triton-tensorwise-seed0": "tensorwise"})
    grad_mean = (4.0 + 5 * 1.0) / 6
    assert text == (f"tensorwise: the grad_output casts underflow most, {grad_mean:.2f}% of nonzero values on average; at worst 4.00% "
                    "(grad_output of layers.0.feed_forward.w2, step 2); GEMM outputs 32.0 dB SQNR against BF16 on average (lowest 31.0 dB).")  # fmt: skip


def test_a_torn_statistics_file_is_an_error_naming_it(tmp_path):
    _loss_run(tmp_path, {})
    (tmp_path / numerics.TENSOR_STATS_CSV).write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(ValueError, match=f"{numerics.TENSOR_STATS_CSV} cannot be read as a curves file"):
        report_numerics.read_curves(tmp_path)


def test_optimizer_conclusion_from_the_table():
    table = pd.DataFrame([
        {"optimizer": "adamw-fp32", "state memory vs FP32": "100.0%", "loss gap vs FP32, last 10%": "+0.00%", "GB/s": 2500.0,
         "% of copy bandwidth": 87.0, "speedup vs torch fused": 1.0},
        {"optimizer": "adamw-e4m3-fp16", "state memory vs FP32": "37.5%", "loss gap vs FP32, last 10%": "-0.71%", "GB/s": 1100.0,
         "% of copy bandwidth": 38.1, "speedup vs torch fused": 0.56},
        {"optimizer": "adamw-e4m3-sqrt-e5m2", "state memory vs FP32": "25.0%", "loss gap vs FP32, last 10%": "n/a", "GB/s": float("nan"),
         "% of copy bandwidth": float("nan"), "speedup vs torch fused": float("nan")},
    ])  # fmt: skip
    assert report_numerics.optimizer_conclusion(table) == (
        "adamw-e4m3-fp16: states 37.5% of FP32's, loss gap -0.71%, the fused update at 38.1% of copy bandwidth and 0.56x torch's fused AdamW. "
        "adamw-e4m3-sqrt-e5m2: states 25.0% of FP32's, loss gap n/a."
    )
