"""`fp8bench numerics` on a micro model on the CPU (kernels under TRITON_INTERPRET=1): loss curves and
their gaps, the start-up experiments' scales and master weights, the optimizer's memory and error, the CLI."""

from __future__ import annotations

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from fp8bench.benchmarks import numerics
from fp8bench.cli import app
from fp8bench.harness.curves import last_fraction_mean, relative_gap
from fp8bench.harness.results import RunWriter, load_results, read_metadata
from fp8bench.nn import text_data
from fp8bench.nn.float8_linear import Float8Linear
from fp8bench.nn.recipes import RECIPES
from fp8kernels import reference

MICRO = numerics.TinyLMConfig(dim=32, layers=1, heads=2, ffn=64)
CONFIG = numerics.TrainConfig(steps=2, batch_size=1, seq_len=16, eval_every=1, eval_batches=1, warmup_steps=1, device="cpu")


def micro() -> torch.nn.Module:
    return numerics.TinyLM(MICRO)


@pytest.fixture(scope="module")
def corpus():
    return text_data.load_stdlib_corpus(max_bytes=1_000_000)


def curves_of(run_dir) -> pd.DataFrame:
    """curves.csv.gz and, where the run took tensor statistics, tensor_stats.csv.gz (pandas reads every gzip
    member): every value of the run."""
    frames = [pd.read_csv(run_dir / numerics.CURVES_CSV, keep_default_na=False)]
    if (run_dir / numerics.TENSOR_STATS_CSV).exists():
        frames.append(pd.read_csv(run_dir / numerics.TENSOR_STATS_CSV, keep_default_na=False))
    return pd.concat(frames, ignore_index=True)


def test_gap_over_the_last_tenth_known_answer():
    reference_losses = [10.0] * 18 + [2.0, 2.0]
    assert last_fraction_mean(reference_losses) == 2.0
    assert relative_gap([9.0] * 18 + [2.0, 2.2], reference_losses) == pytest.approx(0.05)
    assert last_fraction_mean([3.0]) == 3.0


def test_loss_curves_rows_and_determinism(corpus, tmp_path):
    curves = numerics.loss_curves((RECIPES["tensorwise"],), bf16_seeds=(0, 1))
    with RunWriter(tmp_path, {"benchmark": "numerics"}) as writer:
        results = numerics.run_loss(micro, "micro", curves, CONFIG, corpus, writer)
    assert [r.status for r in results] == ["ok"] * 3 and all(len(r.losses) == 2 for r in results)
    rows = load_results(tmp_path)
    assert list(rows["recipe"]) == ["bf16", "bf16", "tensorwise"] and set(rows["case"]) == {"loss"}
    assert rows["rel_err"].iloc[0] == 0.0
    assert rows["rel_err"].iloc[2] == pytest.approx(numerics.relative_gap(results[2].losses, results[0].losses))
    assert json.loads(rows["options"].iloc[1])["seed"] == 1
    values = curves_of(tmp_path)
    per_curve = values.groupby(["curve", "metric"]).size()
    assert per_curve[("triton-tensorwise-seed0", "loss")] == 2 and per_curve[("bf16-seed1", "val_loss")] == 2
    gaps = values[(values.metric == "loss_gap") & (values.curve == "triton-tensorwise-seed0")].set_index("step")["value"]
    assert list(gaps.index) == [1, 2]  # checkpoints at 25-100% of two steps
    assert float(gaps[1]) == pytest.approx(results[2].losses[0] / results[0].losses[0] - 1, rel=1e-6)
    assert float(gaps[2]) == pytest.approx(rows["rel_err"].iloc[2], rel=1e-5)
    # The same seed gives the same curve; another seed another one.
    (tmp_path / "again").mkdir()
    again_writer = numerics.CurveWriter(tmp_path / "again")
    again = numerics.train_curve(micro, curves[0], CONFIG, corpus, again_writer)
    again_writer.close()
    assert again == results[0].losses and results[1].losses != results[0].losses


def test_fp8_curves_on_a_cpu_without_the_interpreter_are_unsupported_rows(corpus, tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    curves = [numerics.Curve("bf16", None), numerics.Curve("tw", RECIPES["tensorwise"])]
    with RunWriter(tmp_path, {}) as writer:
        results = numerics.run_loss(micro, "micro", curves, CONFIG, corpus, writer)
    assert results[0].status == "ok"
    assert results[1].status == "unsupported: our FP8 kernels run on a CUDA GPU, or on the CPU under TRITON_INTERPRET=1"
    assert load_results(tmp_path)["status"].iloc[1] == results[1].status


def test_startup_scales_and_master_weights(corpus, tmp_path):
    with RunWriter(tmp_path, {}) as writer:
        results = numerics.run_startup(micro, "micro", CONFIG, corpus, writer, RECIPES["tensorwise-delayed"])
    assert [r.curve.start for r in results] == ["calibrated", "scale-1", "master-from-hp", "master-from-fp8"] + ["master-from-hp", "master-from-fp8"]
    assert [r.curve.implementation for r in results] == ["triton"] * 4 + ["te"] * 2
    assert [r.status for r in results[4:]] == ["unsupported: transformer_engine is not installed"] * 2  # no TE on this CPU
    values = curves_of(tmp_path)
    history = values[(values.metric == "history_amax") & (values.layer == "blocks.0.qkv") & (values.role == "input")]
    amax = values[(values.metric == "amax") & (values.layer == "blocks.0.qkv") & (values.role == "input")]
    scale_one = history[history.curve == "scale-1-seed0"].set_index("step")["value"]
    # Scale 1 at the first step (the FP8 maximum as the history's amax), the recorded amax after it.
    assert float(scale_one[1]) == reference.fp8_max(reference.E4M3)
    assert float(scale_one[2]) == pytest.approx(float(amax[(amax.curve == "scale-1-seed0") & (amax.step == 1)]["value"].iloc[0]))
    # Calibrated on the first batch: its first step scales by exactly that batch's amax.
    calibrated = history[history.curve == "calibrated-seed0"].set_index("step")["value"]
    assert float(calibrated[1]) == pytest.approx(float(amax[(amax.curve == "calibrated-seed0") & (amax.step == 1)]["value"].iloc[0]))
    rows = load_results(tmp_path)
    assert list(rows["case"]) == ["startup.scale-1"] * 2 + ["startup.master-from-fp8"] * 2 + ["startup.te-master-from-fp8"] * 2
    assert list(rows["backend"][4:]) == ["te", "te"]


def test_master_weights_from_fp8_are_the_cast_weights():
    recipe = RECIPES["tensorwise-delayed"]
    hp = numerics.build_model(micro, numerics.Curve("hp", recipe, start="master-from-hp"), "cpu").model
    fp8 = numerics.build_model(micro, numerics.Curve("fp8", recipe, start="master-from-fp8"), "cpu").model
    pairs = [(a, b) for a, b in zip(hp.modules(), fp8.modules()) if isinstance(a, Float8Linear)]
    assert pairs
    for a, b in pairs:
        q, scale = reference.quantize_tensorwise(a.weight.detach(), reference.E4M3)
        assert torch.equal(b.weight.detach(), reference.dequantize(q, scale))
        assert not torch.equal(a.weight, b.weight)
    assert type(hp.output) is torch.nn.Linear and torch.equal(hp.output.weight, fp8.output.weight)  # the LM head stays in high precision


def test_optimizer_memory_and_update_error(corpus, tmp_path):
    with RunWriter(tmp_path, {}) as writer:
        summary = numerics.run_optimizer(micro, "micro", CONFIG, corpus, writer, loss_steps=0, error_steps=3)
    assert summary["adamw-e4m3-sqrt-e5m2.state_memory_vs_fp32"] <= 0.40
    assert summary["adamw-e4m3-fp16.state_memory_vs_fp32"] <= 0.40
    assert 0 < summary["adamw-e4m3-sqrt-e5m2.update_rel_err"] < 0.2
    assert 0 < summary["adamw-e4m3-fp16.update_rel_err"] < 0.2
    errors = curves_of(tmp_path)
    assert len(errors[errors.metric == "update_rel_err"]) == 6


def test_optimizer_timing_rows_with_a_fake_timer(corpus, tmp_path):
    """The timing path's rows, GB/s and speedups, timed by a fake timer (random milliseconds, never a GPU number)."""
    from test_cast import FakeTimer

    from fp8bench.config import TimingConfig

    timing = TimingConfig(repeats=3, settle_ms=0, warmup_ms=0, samples_ms=1)
    with RunWriter(tmp_path, {}) as writer:
        numerics.run_optimizer(micro, "micro", CONFIG, corpus, writer, loss_steps=0, error_steps=1, timer=FakeTimer(), timing=timing)
    rows = load_results(tmp_path)
    assert list(rows["case"]) == ["optimizer.update"] * 3 and set(rows["timer"]) == {"fake"}
    assert list(rows["recipe"]) == ["adamw-fp32", "adamw-e4m3-sqrt-e5m2", "adamw-e4m3-fp16"]
    assert list(rows["backend"]) == ["torch", "triton", "triton"]
    numel = sum(p.numel() for p in micro().parameters())
    for row, fmt in zip(rows.itertuples(), (None, *numerics.StateFormat)):
        assert row.gbps == pytest.approx(numerics.optimizer_bytes(fmt, numel) / row.median_ms / 1e6, rel=1e-5)
    assert rows["speedup_vs_bf16"].iloc[0] == 1.0


def test_cli_loss_writes_rows_curves_and_corpus_metadata(tmp_path, monkeypatch):
    monkeypatch.setitem(numerics.MODELS, "micro", micro)
    out = tmp_path / "run"
    args = ["numerics", "loss", "--model", "micro", "--recipe", "tensorwise", "--steps", "2", "--batch-size", "1", "--seq-len", "16",
            "--bf16-seeds", "1", "--corpus-bytes", "1000000", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "loss gap to BF16 with the same seed over the last 10% of steps, mean over seeds:" in result.output
    assert "triton tensorwise" in result.output and "(one seed)" in result.output
    assert list(load_results(out)["status"]) == ["ok", "ok"]
    metadata = read_metadata(out)
    assert metadata["corpus"]["bytes_sha256"] == text_data.load_stdlib_corpus(1_000_000).bytes_sha256
    assert metadata["train"]["steps"] == 2


def test_cli_bad_options_exit_2_with_the_reason(tmp_path):
    result = CliRunner().invoke(app, ["numerics", "startup", "--recipe", "tensorwise", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "needs a recipe with delayed scaling" in result.output
    result = CliRunner().invoke(app, ["numerics", "loss", "--recipe", "nope", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "unknown recipe 'nope'" in result.output


def _suite_entries():
    from pathlib import Path

    from fp8bench.harness.suite import load_suite

    return load_suite(Path(__file__).resolve().parent.parent / "suites" / "numerics.toml").entries


def test_the_numerics_suite_runs_each_command_into_its_folder(tmp_path):
    argvs = {entry.name: entry.argv(tmp_path) for entry in _suite_entries()}
    assert list(argvs) == ["loss-all", "loss-constant-lr", "startup", "loss", "stats", "optimizer"]
    assert argvs["loss"][:2] == ["numerics", "loss"] and argvs["loss"][-2:] == ["--out", str(tmp_path / "loss")]
    assert argvs["loss-all"].count("--implementation") == 3 and argvs["loss-all"][argvs["loss-all"].index("--jobs") + 1] == "8"
    assert argvs["optimizer"][:4] == ["numerics", "optimizer", "--model", "llama-25m"]
    # `fp8bench run --resume` continues a cut loss run in its folder (the other numerics commands start again).
    for name in ("loss-all", "startup"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.csv").write_text("benchmark\n")
    resumed = {entry.name: entry.argv(tmp_path, resume=True) for entry in _suite_entries()}
    assert "--resume" in resumed["loss-all"] and "--resume" not in resumed["startup"]


def test_optimizer_loss_curves_in_workers_with_the_schedule_asked(tmp_path, monkeypatch):
    """`numerics optimizer --jobs 2 --lr-schedule constant`: the three optimizers' curves trained in worker
    processes, each row recording the schedule; the default schedule is the loss command's (cosine)."""
    monkeypatch.setitem(numerics.MODELS, "micro", micro)
    smoke = [item for pair in SMOKE.items() for item in pair]
    result = CliRunner().invoke(app, ["numerics", "optimizer", *smoke, "--loss-steps", "2", "--error-steps", "1", "--jobs", "2",
                                      "--lr-schedule", "constant", "--out", str(tmp_path / "constant")])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = load_results(tmp_path / "constant")
    loss_rows = rows[rows["case"] == "optimizer.loss"]
    assert sorted(loss_rows["recipe"]) == ["adamw-e4m3-fp16", "adamw-e4m3-sqrt-e5m2", "adamw-fp32"] and set(loss_rows["status"]) == {"ok"}
    assert {json.loads(options)["lr_schedule"] for options in loss_rows["options"]} == {"constant"}
    result = CliRunner().invoke(app, ["numerics", "optimizer", *smoke, "--loss-steps", "2", "--error-steps", "1", "--out", str(tmp_path / "default")])
    assert result.exit_code == 0, result.output
    rows = load_results(tmp_path / "default")
    assert {json.loads(options)["lr_schedule"] for options in rows[rows["case"] == "optimizer.loss"]["options"]} == {"cosine"}


# Each entry's own options, then a micro model and a few steps (a later value of an option wins in click).
SMOKE = {"--model": "micro", "--batch-size": "1", "--seq-len": "16", "--corpus-bytes": "1000000"}
SMOKE_STEPS = {"numerics loss": ("--steps", "2"), "numerics stats": ("--steps", "2"), "numerics startup": ("--steps", "2"),
               "numerics optimizer": ("--loss-steps", "1")}  # fmt: skip


@pytest.mark.parametrize("entry", _suite_entries(), ids=lambda entry: entry.name)
def test_every_suite_entry_runs_on_a_micro_model(entry, tmp_path, monkeypatch):
    """A smoke run of each entry as the suite gives it, on a micro model for two steps: every option is one
    the command takes and every curve ends ok or as an unsupported row (torchao and TE are not here)."""
    monkeypatch.setitem(numerics.MODELS, "micro", micro)
    argv = entry.argv(tmp_path)
    command = " ".join(argv[:2])
    extra = [item for pair in SMOKE.items() for item in pair] + list(SMOKE_STEPS[command])
    if entry.options.get("seeds", 1) > 1:  # the options stay the entry's; one seed of each FP8 curve, two worker processes
        extra += ["--seeds", "1", "--jobs", "2"]
    result = CliRunner().invoke(app, [*argv, *extra])
    assert result.exit_code == 0, result.output
    statuses = set(load_results(tmp_path / entry.name)["status"])
    assert statuses <= {"ok", "unsupported: torchao is not installed", "unsupported: transformer_engine is not installed"}, statuses
    assert "ok" in statuses


@pytest.mark.gpu
def test_every_recipe_and_state_format_trains_on_a_gpu(corpus, tmp_path):
    """On a GPU: every recipe of ours and both FP8 optimizer state formats train the tiny-2l model and
    stay near BF16 after a few steps."""
    config = numerics.TrainConfig(steps=20, batch_size=4, seq_len=128, eval_every=10, eval_batches=2, warmup_steps=5, device="cuda")
    curves = [*numerics.loss_curves(tuple(RECIPES.values()), (0,)), *numerics.optimizer_curves()[1:]]
    with RunWriter(tmp_path, {}) as writer:
        results = numerics.run_loss(numerics.MODELS["tiny-2l"], "tiny-2l", curves, config, corpus, writer)
    for result in results:
        assert result.status == "ok", (result.curve.name, result.status)
        assert abs(numerics.relative_gap(result.losses, results[0].losses)) < 0.05, result.curve.name
