"""`fp8bench numerics loss` with several seeds, a learning-rate schedule and worker processes, on a micro
model on the CPU: the schedule's values, the curves per seed and the reference of each gap, curves trained in
workers identical to curves trained in this process, a crashed or failing worker as a failed row, rows of curves
that finish before their reference, resuming a run, an interrupt that loses nothing finished, and the noise
statistics of the gaps."""

from __future__ import annotations

import json
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from fp8bench.benchmarks import numerics
from fp8bench.cli import app
from fp8bench.harness.curves import SeedGaps, bf16_noise, read_loss_curves, relative_gap, seed_gaps
from fp8bench.harness.results import RunWriter, load_results
from fp8bench.nn import text_data
from fp8bench.nn.recipes import RECIPES

MICRO = numerics.TinyLMConfig(dim=32, layers=1, heads=2, ffn=64)
CONFIG = numerics.TrainConfig(steps=3, batch_size=1, seq_len=16, eval_every=3, eval_batches=1, warmup_steps=1, device="cpu")


def micro() -> torch.nn.Module:
    return numerics.TinyLM(MICRO)


def crashes_with_seed_1() -> torch.nn.Module:
    """The micro model, but a process that builds it with seed 1 dies at once (as a segfault would end it)."""
    if torch.initial_seed() == 1:
        os._exit(3)
    return micro()


def fails_with_seed_1() -> torch.nn.Module:
    if torch.initial_seed() == 1:
        raise RuntimeError("a bug in the model\nits second line")
    return micro()


@pytest.fixture(scope="module")
def corpus():
    return text_data.load_stdlib_corpus(max_bytes=1_000_000)


def curve_names(run_dir) -> list[str]:
    return [json.loads(options)["curve"] for options in load_results(run_dir)["options"]]


def test_cosine_schedule_warms_up_then_falls_to_a_tenth_at_the_last_step():
    config = numerics.TrainConfig(steps=110, lr=1e-3, warmup_steps=10, lr_schedule="cosine")
    assert config.lr_schedule is numerics.LRSchedule.COSINE
    assert config.lr_at(5) == pytest.approx(5e-4) and config.lr_at(10) == pytest.approx(1e-3)
    assert config.lr_at(60) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # half way: the cosine's middle
    assert config.lr_at(110) == pytest.approx(1e-4)
    constant = numerics.TrainConfig(steps=110, lr=1e-3, warmup_steps=10)
    assert [constant.lr_at(s) for s in (5, 10, 60, 110)] == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3])
    with pytest.raises(ValueError, match="'linear' is not a valid LRSchedule"):
        numerics.TrainConfig(lr_schedule="linear")


def test_each_fp8_curve_per_seed_and_its_reference_is_bf16_with_that_seed():
    curves = numerics.loss_curves((RECIPES["tensorwise"],), bf16_seeds=(0, 1, 2), implementations=("triton", "te"), seeds=(0, 1))
    assert [c.name for c in curves] == ["bf16-seed0", "bf16-seed1", "bf16-seed2", "triton-tensorwise-seed0", "te-tensorwise-seed0",
                                        "triton-tensorwise-seed1", "te-tensorwise-seed1"]  # fmt: skip
    assert [numerics.loss_reference(c, curves) for c in curves] == ["bf16-seed0"] * 3 + ["bf16-seed0"] * 2 + ["bf16-seed1"] * 2
    assert [c.name for c in numerics.loss_curves((RECIPES["tensorwise"],), bf16_seeds=(0,), seeds=(0, 1))][:2] == ["bf16-seed0", "bf16-seed1"]
    assert [c.name for c in numerics.loss_curves((RECIPES["tensorwise"],), bf16_seeds=(0, 1), seeds=())] == ["bf16-seed0", "bf16-seed1"]


def test_curves_in_worker_processes_are_those_of_one_process(corpus, tmp_path):
    curves = numerics.loss_curves((), bf16_seeds=(0, 1, 2), seeds=())
    runs = {}
    for jobs in (1, 2):
        with RunWriter(tmp_path / str(jobs), {"benchmark": "numerics"}) as writer:
            results = numerics.run_loss(micro, "micro", curves, CONFIG, corpus, writer, jobs=jobs)
        assert [r.status for r in results] == ["ok"] * 3
        runs[jobs] = read_loss_curves(tmp_path / str(jobs))
        assert sorted(curve_names(tmp_path / str(jobs))) == ["bf16-seed0", "bf16-seed1", "bf16-seed2"]
        assert not (tmp_path / str(jobs) / numerics.PARTS).exists()  # every curve joined curves.csv
    assert runs[1] == runs[2]  # bit for bit: 8 digits of each loss
    rows = load_results(tmp_path / "2").assign(curve=curve_names(tmp_path / "2")).set_index("curve")
    assert rows.loc["bf16-seed1", "rel_err"] == pytest.approx(relative_gap(runs[2]["bf16-seed1"], runs[2]["bf16-seed0"]), abs=1e-6)


@pytest.mark.parametrize(("factory", "status"), [
    (crashes_with_seed_1, "failed: its worker process ended with exit code 3"),
    (fails_with_seed_1, "failed: RuntimeError: a bug in the model"),
])  # fmt: skip
def test_a_worker_that_crashes_or_fails_is_a_failed_row_and_the_run_goes_on(corpus, tmp_path, factory, status):
    curves = numerics.loss_curves((), bf16_seeds=(0, 1, 2), seeds=())
    with RunWriter(tmp_path, {"benchmark": "numerics"}) as writer:
        results = numerics.run_loss(factory, "micro", curves, CONFIG, corpus, writer, jobs=2)
    assert {r.curve.name: r.status for r in results} == {"bf16-seed0": "ok", "bf16-seed1": status, "bf16-seed2": "ok"}
    rows = load_results(tmp_path).assign(curve=curve_names(tmp_path)).set_index("curve")
    assert rows.loc["bf16-seed1", "status"] == status and math.isnan(rows.loc["bf16-seed1", "rel_err"])
    assert set(read_loss_curves(tmp_path)) == {"bf16-seed0", "bf16-seed2"}


def test_a_curve_that_finishes_before_its_reference_gets_its_row_when_the_reference_does(corpus, tmp_path):
    fp8 = numerics.Curve("triton-tensorwise-seed1", RECIPES["tensorwise"], 1)
    curves = [numerics.Curve("bf16-seed0"), fp8, numerics.Curve("bf16-seed1", seed=1)]
    with RunWriter(tmp_path, {"benchmark": "numerics"}) as writer:
        numerics.run_loss(micro, "micro", curves, CONFIG, corpus, writer)
    assert curve_names(tmp_path) == ["bf16-seed0", "bf16-seed1", "triton-tensorwise-seed1"]
    losses = read_loss_curves(tmp_path)
    rows = load_results(tmp_path)
    assert rows["rel_err"].iloc[2] == pytest.approx(relative_gap(losses["triton-tensorwise-seed1"], losses["bf16-seed1"]), abs=1e-6)


def test_an_interrupt_keeps_the_finished_curves_and_resume_trains_only_the_others(corpus, tmp_path):
    curves = numerics.loss_curves((), bf16_seeds=(0, 1, 2), seeds=())
    finished = []

    def interrupt_after_the_first(result) -> None:
        finished.append(result.curve.name)
        if len(finished) == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), RunWriter(tmp_path / "cut", {"benchmark": "numerics"}) as writer:
        numerics.run_loss(micro, "micro", curves, CONFIG, corpus, writer, on_curve=interrupt_after_the_first)
    assert curve_names(tmp_path / "cut") == ["bf16-seed0"] and set(read_loss_curves(tmp_path / "cut")) == {"bf16-seed0"}
    finished.clear()
    with RunWriter(tmp_path / "cut", {"benchmark": "numerics"}, resume=True) as writer:
        results = numerics.run_loss(micro, "micro", curves, CONFIG, corpus, writer, on_curve=lambda r: finished.append(r.curve.name))
    assert finished == ["bf16-seed1", "bf16-seed2"] and [r.curve.name for r in results] == ["bf16-seed0", "bf16-seed1", "bf16-seed2"]
    with RunWriter(tmp_path / "whole", {"benchmark": "numerics"}) as writer:
        numerics.run_loss(micro, "micro", curves, CONFIG, corpus, writer)
    assert read_loss_curves(tmp_path / "cut") == read_loss_curves(tmp_path / "whole")
    cut, whole = load_results(tmp_path / "cut"), load_results(tmp_path / "whole")
    assert list(cut["rel_err"]) == pytest.approx(list(whole["rel_err"]), abs=1e-6)  # a resumed run's references: curves.csv's 8 digits


def test_cli_seeds_jobs_schedule_and_resume(tmp_path, monkeypatch):
    monkeypatch.setitem(numerics.MODELS, "micro", micro)
    out = tmp_path / "run"
    args = ["numerics", "loss", "--model", "micro", "--seeds", "0", "--bf16-seeds", "2", "--steps", "3", "--batch-size", "1", "--seq-len", "16",
            "--corpus-bytes", "1000000", "--lr-schedule", "constant", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "BF16 run-to-run noise of the loss over the last 10% of steps, over 2 seeds:" in result.output
    assert {json.loads(o)["lr_schedule"] for o in load_results(out)["options"]} == {"constant"}
    again = CliRunner().invoke(app, [*args, "--bf16-seeds", "3", "--jobs", "2", "--resume"])
    assert again.exit_code == 0, again.output
    assert curve_names(out) == ["bf16-seed0", "bf16-seed1", "bf16-seed2"]
    other = CliRunner().invoke(app, [*args[:-4], "--lr-schedule", "cosine", "--out", str(out), "--resume"])
    assert other.exit_code == 2 and "was run with another train" in other.output
    assert CliRunner().invoke(app, [*args[:-2], "--resume"]).exit_code == 2  # --resume needs --out
    bad = CliRunner().invoke(app, [*args[:-2], "--lr-schedule", "linear", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "linear" in bad.output


def test_noise_and_seed_gaps_known_answers():
    assert bf16_noise([[1.0] * 10, [1.02] * 10, [0.98] * 10]) == pytest.approx(0.02)  # sample standard deviation / mean
    assert math.isnan(bf16_noise([[1.0] * 10]))
    gaps = seed_gaps([([1.01] * 10, [1.0] * 10), ([1.03] * 10, [1.0] * 10)], [[1.0] * 10, [1.02] * 10, [0.98] * 10])
    assert gaps.gaps == pytest.approx((0.01, 0.03)) and gaps.mean == pytest.approx(0.02)
    assert gaps.band == pytest.approx(2 * 0.02 * math.sqrt(2 / 2)) and gaps.within_noise and not gaps.within_target
    assert gaps.describe() == "+2.00% (seeds +1.00% .. +3.00%); within the noise (±4.00%); OUTSIDE 1%"
    lone = SeedGaps((-0.005,), math.nan)
    assert lone.within_noise is None and lone.within_target and lone.describe() == "-0.50% (one seed); within 1%"
    assert not SeedGaps((math.nan,), 0.01).within_target  # a diverged curve is not within
