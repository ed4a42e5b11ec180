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


def _loss_run(run_dir, fp8_gaps: dict[str, np.ndarray], statuses: dict[str, str] | None = None, bf16_offsets=(0.0, 0.002, -0.004)) -> None:
    """BF16 with a seed per offset, each at a falling loss that much above seed 0's, and each FP8 curve (named
    <implementation>-<recipe>-seed<n>) at its per-step relative gap to BF16 with its seed."""
    statuses = statuses or {}
    base = 3.0 - np.linspace(0.0, 1.0, STEPS)
    bf16 = {f"bf16-seed{seed}": base * (1 + offset) for seed, offset in enumerate(bf16_offsets)}
    losses = {**bf16, **{name: bf16[f"bf16-seed{name.rsplit('-seed', 1)[1]}"] * (1 + gap) for name, gap in fp8_gaps.items()}}
    writer = numerics.CurveWriter(run_dir)
    for name, values in losses.items():
        for step, value in enumerate(values, 1):
            writer.write(name, step, "loss", float(value))
    writer.close()

    def curve(name: str, implementation: str | None = None) -> numerics.Curve:
        prefix, seed = name.rsplit("-seed", 1)
        if prefix == "bf16":
            return numerics.Curve(name, seed=int(seed))
        backend, recipe = prefix.split("-", 1)
        return numerics.Curve(name, RECIPES[recipe], int(seed), implementation=implementation or backend)

    curves = [curve(name) for name in [*bf16, *fp8_gaps, *statuses]]
    with RunWriter(run_dir, {"benchmark": "numerics"}) as results:
        for c in curves:
            reference = losses.get(f"bf16-seed{c.seed}") if c.recipe else losses["bf16-seed0"]
            gap = None if c.name in statuses else numerics.relative_gap(list(losses[c.name]), list(reference))
            results.append(numerics._row("loss", c, CONFIG, "synthetic", statuses.get(c.name, "ok"), {"rel_err": gap}))


def _tail_mean(values: np.ndarray) -> float:
    return float(values[-max(1, int(np.ceil(0.1 * len(values)))):].mean())


def test_headline_per_recipe_mean_gap_over_seeds_spread_and_noise(tmp_path):
    # tensorwise: +0.3% with seed 0 and +0.5% with seed 1; rowwise: +3% with both; blockwise: -2% with seed 0 only.
    _loss_run(tmp_path, {"triton-tensorwise-seed0": np.full(STEPS, 0.003), "triton-tensorwise-seed1": np.full(STEPS, 0.005),
                         "triton-rowwise-seed0": np.full(STEPS, 0.03), "triton-rowwise-seed1": np.full(STEPS, 0.03),
                         "triton-blockwise-seed0": np.full(STEPS, -0.02)},
              {"torchao-blockwise-seed0": "unsupported: torchao has no blockwise recipe"})  # fmt: skip
    rows = load_results(tmp_path)
    table = report_numerics.headline(rows, report_numerics.read_curves(tmp_path)).set_index(["implementation", "recipe"])
    base = 3.0 - np.linspace(0.0, 1.0, STEPS)
    means = np.array([_tail_mean(base * (1 + offset)) for offset in (0.0, 0.002, -0.004)])
    sigma = means.std(ddof=1) / means.mean()  # the BF16 seeds' relative standard deviation
    assert table.loc[("bf16", "bf16"), "noise band"] == f"σ {100 * sigma:.2f}%"
    assert table.loc[("bf16", "bf16"), "over the seeds"] == "-0.40% .. +0.20% to bf16-seed0"
    assert list(table.index) == [("bf16", "bf16"), ("triton", "tensorwise"), ("triton", "rowwise"), ("triton", "blockwise"), ("torchao", "blockwise")]
    tensorwise = table.loc[("triton", "tensorwise")]
    assert (tensorwise["seeds"], tensorwise["gap vs BF16, last 10%"], tensorwise["over the seeds"]) == (2, "+0.40%", "+0.30% .. +0.50%")
    two_seeds, one_seed = 2 * sigma * np.sqrt(2 / 2), 2 * sigma * np.sqrt(2 / 1)
    assert tensorwise["noise band"] == f"±{100 * two_seeds:.2f}%" and tensorwise["verdict"] == "within the noise; within 1%"
    assert table.loc[("triton", "rowwise"), "verdict"] == "outside the noise; OUTSIDE 1%"
    blockwise = table.loc[("triton", "blockwise")]
    assert (blockwise["over the seeds"], blockwise["noise band"]) == ("one seed", f"±{100 * one_seed:.2f}%")
    assert blockwise["verdict"] == "outside the noise; OUTSIDE 1%"
    missing = table.loc[("torchao", "blockwise")]
    assert (missing["seeds"], missing["verdict"]) == (0, "not measured") and missing["status"].startswith("unsupported")
    text = report_numerics.loss_conclusion(table.reset_index())
    assert text == (f"BF16 with 3 seeds: run-to-run noise {100 * sigma:.2f}% (standard deviation of the loss over the last 10% of steps). "
                    "1 of the 3 FP8 recipes that ran are within 1% of BF16 with the same seed; outside: triton rowwise +3.00%, "
                    "triton blockwise -2.00%. Outside the noise band (a gap the BF16 seeds' spread would give less than 1 time in 20): "
                    "triton rowwise +3.00%, triton blockwise -2.00%. Seeds per recipe: 1, 2. "
                    "Not run: torchao blockwise (unsupported: torchao has no blockwise recipe).")  # fmt: skip
    page = "".join(report_numerics.sections(tmp_path, rows))
    assert f'<p class="conclusion">{html.escape(text)}</p>' in page


def test_one_bf16_seed_has_no_noise_band(tmp_path):
    _loss_run(tmp_path, {"triton-tensorwise-seed0": np.full(STEPS, 0.003)}, bf16_offsets=(0.0,))
    table = report_numerics.headline(load_results(tmp_path), report_numerics.read_curves(tmp_path))
    assert list(table["noise band"]) == ["n/a (one seed)", "n/a"]
    assert list(table["verdict"])[1] == "within 1%"


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
    (tmp_path / numerics.TENSOR_STATS_CSV).write_bytes(b"\x1f\x8b\x08\x00garbage")  # a gzip header, then no whole row
    with pytest.raises(ValueError, match=f"{numerics.TENSOR_STATS_CSV}: not one whole row: the gzip member from byte 0 on is cut short"):
        report_numerics.read_curves(tmp_path)


def test_optimizer_conclusion_from_the_table():
    table = pd.DataFrame([
        {"optimizer": "adamw-fp32", "state memory vs FP32": "100.0%", "loss gap vs FP32, last 10%": "+0.00%", "GB/s": 2500.0,
         "% of copy bandwidth": 87.0, "speedup vs torch fused": 1.0},
        {"optimizer": "adamw-e4m3-fp16", "state memory vs FP32": "37.5%", "loss gap vs FP32, last 10%": "-0.71%", "GB/s": 1100.0,
         "% of copy bandwidth": 38.1, "speedup vs torch fused": 0.56, "seeds": 2, "over the seeds": "-0.90% .. -0.52%",
         "noise band": "±0.88%"},
        {"optimizer": "adamw-e4m3-sqrt-e5m2", "state memory vs FP32": "25.0%", "loss gap vs FP32, last 10%": "n/a", "GB/s": float("nan"),
         "% of copy bandwidth": float("nan"), "speedup vs torch fused": float("nan")},
    ])  # fmt: skip
    assert report_numerics.optimizer_conclusion(table) == (
        "adamw-e4m3-fp16: states 37.5% of FP32's, loss gap -0.71% (mean of 2 seeds, -0.90% .. -0.52%; noise band ±0.88%), the fused update at 38.1% of copy bandwidth and 0.56x torch's fused AdamW. "
        "adamw-e4m3-sqrt-e5m2: states 25.0% of FP32's, loss gap n/a."
    )
