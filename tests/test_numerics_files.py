"""The size of a numerics run's files: tensor statistics on a thinning schedule, both files gzip-compressed
(curves.csv.gz and tensor_stats.csv.gz), so that a 1000-step stats run of llama-25m with every recipe stays
under 2 MiB."""

from __future__ import annotations

import random

import pandas as pd
import torch
from torch import nn

from fp8bench.benchmarks import numerics
from fp8bench.harness.curves import STAT_METRICS, stats_recorded_at
from fp8bench.nn.recipes import RECIPE_CHOICES
from fp8bench.nn.tensor_stats import OUTPUT_ROLE


def test_statistics_schedule_every_step_at_the_start_then_thinner_and_the_last():
    recorded = [step for step in range(1, 1001) if stats_recorded_at(step, 1000)]
    assert recorded[:50] == list(range(1, 51))
    assert recorded[50:65] == list(range(60, 201, 10))
    assert recorded[65:] == list(range(250, 1001, 50))
    assert [step for step in range(1, 38) if stats_recorded_at(step, 37)] == list(range(1, 38))
    assert [step for step in range(1, 224) if stats_recorded_at(step, 223)][-2:] == [200, 223]  # the last step too


def test_a_1000_step_llama_25m_stats_run_writes_under_2_mib(tmp_path):
    """Every value a 1000-step `numerics stats` run of llama-25m writes (BF16 and every recipe of ours: loss,
    gradient norm and validation loss per step, each layer's statistics per role at the recorded steps),
    with random values (which compress worse than measured ones)."""
    with torch.device("meta"):
        model = numerics.Llama(numerics.LLAMA_SMALL)
    layers = [name for name, module in model.named_modules() if isinstance(module, nn.Linear) and name != "output"]
    assert len(layers) == 32
    rng = random.Random(0)
    writer = numerics.CurveWriter(tmp_path)
    steps = 1000
    for curve in ["bf16-seed0", *(f"triton-{recipe.name}-seed0" for recipe in RECIPE_CHOICES["all"])]:
        delayed = "delayed" in curve
        for step in range(1, steps + 1):
            writer.write(curve, step, "loss", rng.uniform(1, 5))
            writer.write(curve, step, "grad_norm", rng.uniform(0, 3))
            if step % 100 == 0:
                writer.write(curve, step, "val_loss", rng.uniform(1, 5))
            if curve.startswith("bf16") or not stats_recorded_at(step, steps):
                continue
            for layer in layers:
                for role in ("input", "weight", "grad_output"):
                    for metric in STAT_METRICS:
                        if metric == "sqnr_db" or (metric == "history_amax" and not delayed):
                            continue  # sqnr is the output's; a dynamic cast has no history (written as no row)
                        writer.write_stat(curve, step, metric, rng.choice([0.0, rng.uniform(0, 100)]), layer, role)
                writer.write_stat(curve, step, "sqnr_db", rng.uniform(20, 40), layer, OUTPUT_ROLE)
        writer.flush()  # one member per curve and file, as a finished curve joins the run
    writer.close()
    sizes = {path.name: path.stat().st_size for path in tmp_path.iterdir()}
    assert set(sizes) == {numerics.CURVES_CSV, numerics.TENSOR_STATS_CSV}
    assert sum(sizes.values()) < 2 * 2**20, sizes
    stats = pd.read_csv(tmp_path / numerics.TENSOR_STATS_CSV)  # the gzip file reads back whole
    assert stats["step"].nunique() == sum(stats_recorded_at(step, steps) for step in range(1, steps + 1))
    assert len(stats) == 5 * stats["step"].nunique() * 32 * (3 * 4 + 1) + stats["step"].nunique() * 32 * 3
