"""`fp8bench numerics loss` with several seeds, a learning-rate schedule and worker processes, on a micro
model on the CPU: the schedule's values, the curves per seed and the reference of each gap, curves trained in
workers identical to curves trained in this process, a crashed or failing worker as a failed row, rows of curves
that finish before their reference, resuming a run (after an interrupt, after a kill while a curve joined the
curves file, in a folder with an older run's plain curves.csv), an interrupt that loses nothing finished, and the
noise statistics of the gaps."""

from __future__ import annotations

import gzip
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
from fp8bench.harness.curves import (
    CURVES_CSV, LEGACY_CURVES_CSV, SeedGaps, bf16_noise, read_loss_curves, read_values_text, relative_gap, seed_gaps,
)
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
        assert not (tmp_path / str(jobs) / numerics.PARTS).exists()  # every curve joined the curves file
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


THREE_BF16 = numerics.loss_curves((), bf16_seeds=(0, 1, 2), seeds=())


def _interrupted_after_the_first_curve(corpus, run_dir) -> None:
    """A loss run of THREE_BF16 interrupted once its first curve has finished (its values and row written)."""

    def interrupt(result) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), RunWriter(run_dir, {"benchmark": "numerics"}) as writer:
        numerics.run_loss(micro, "micro", THREE_BF16, CONFIG, corpus, writer, on_curve=interrupt)
    assert curve_names(run_dir) == ["bf16-seed0"] and set(read_loss_curves(run_dir)) == {"bf16-seed0"}


def _resumed(corpus, run_dir) -> list[str]:
    """The curves a resumed run of THREE_BF16 in `run_dir` trains."""
    finished = []
    with RunWriter(run_dir, {"benchmark": "numerics"}, resume=True) as writer:
        results = numerics.run_loss(micro, "micro", THREE_BF16, CONFIG, corpus, writer, on_curve=lambda r: finished.append(r.curve.name))
    assert [r.curve.name for r in results] == ["bf16-seed0", "bf16-seed1", "bf16-seed2"]
    return finished


@pytest.fixture(scope="module")
def whole_run(corpus, tmp_path_factory):
    """THREE_BF16 run without an interrupt."""
    run_dir = tmp_path_factory.mktemp("whole")
    with RunWriter(run_dir, {"benchmark": "numerics"}) as writer:
        numerics.run_loss(micro, "micro", THREE_BF16, CONFIG, corpus, writer)
    return run_dir


def _same_values(run_dir, whole_run) -> None:
    """The run's curves file holds the rows of the run without an interrupt in the same order; each checkpoint gap
    as computed from the references read back (8 digits) where the reference was trained before the resume."""
    resumed, whole = (read_values_text(run / CURVES_CSV).splitlines() for run in (run_dir, whole_run))
    assert [line.rsplit(",", 1)[0] for line in resumed] == [line.rsplit(",", 1)[0] for line in whole]
    assert [line for line in resumed if ",loss_gap," not in line] == [line for line in whole if ",loss_gap," not in line]
    gaps = [(float(a.rsplit(",", 1)[1]), float(b.rsplit(",", 1)[1])) for a, b in zip(resumed, whole) if ",loss_gap," in a]
    assert len(gaps) == 9 and [a for a, _ in gaps] == pytest.approx([b for _, b in gaps], abs=1e-6)


def test_an_interrupt_keeps_the_finished_curves_and_resume_trains_only_the_others(corpus, tmp_path, whole_run):
    _interrupted_after_the_first_curve(corpus, tmp_path)
    assert _resumed(corpus, tmp_path) == ["bf16-seed1", "bf16-seed2"]
    assert read_loss_curves(tmp_path) == read_loss_curves(whole_run)
    _same_values(tmp_path, whole_run)
    cut, whole = load_results(tmp_path), load_results(whole_run)
    assert list(cut["rel_err"]) == pytest.approx(list(whole["rel_err"]), abs=1e-6)  # a resumed run's references: the file's 8 digits


def test_resume_after_a_kill_while_a_curve_joined_the_file_trains_that_curve_again(corpus, tmp_path, whole_run):
    """Killed while bf16-seed1's values were appended, before its row: the member holds all its rows but not
    its CRC and length. A reader reads the rows; the resumed run cuts the member off and trains the curve again."""
    _interrupted_after_the_first_curve(corpus, tmp_path)
    lines = read_values_text(whole_run / CURVES_CSV).splitlines(keepends=True)
    joined = "".join(line for line in lines if line.startswith("bf16-seed1,") and ",loss_gap," not in line)
    with (tmp_path / CURVES_CSV).open("ab") as handle:
        handle.write(gzip.compress(joined.encode(), mtime=0)[:-8])
    assert read_loss_curves(tmp_path)["bf16-seed1"] == read_loss_curves(whole_run)["bf16-seed1"]  # every whole row is read
    assert _resumed(corpus, tmp_path) == ["bf16-seed1", "bf16-seed2"]
    _same_values(tmp_path, whole_run)  # each value once, none cut
    assert list(load_results(tmp_path)["rel_err"]) == pytest.approx(list(load_results(whole_run)["rel_err"]), abs=1e-6)


def test_resume_of_an_older_runs_plain_curves_file_converts_it(corpus, tmp_path, whole_run):
    _interrupted_after_the_first_curve(corpus, tmp_path)
    (tmp_path / LEGACY_CURVES_CSV).write_text(read_values_text(tmp_path / CURVES_CSV), newline="")
    (tmp_path / CURVES_CSV).unlink()
    assert list(read_loss_curves(tmp_path)) == ["bf16-seed0"]
    assert _resumed(corpus, tmp_path) == ["bf16-seed1", "bf16-seed2"]
    assert not (tmp_path / LEGACY_CURVES_CSV).exists()
    _same_values(tmp_path, whole_run)


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
    (out / LEGACY_CURVES_CSV).write_text(read_values_text(out / CURVES_CSV), newline="")
    both = CliRunner().invoke(app, [*args, "--bf16-seeds", "4", "--resume"], env={"COLUMNS": "300"})
    assert both.exit_code == 2 and f"error: {out / CURVES_CSV} and {out / LEGACY_CURVES_CSV}: a run folder holds one curves file" in both.output
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
