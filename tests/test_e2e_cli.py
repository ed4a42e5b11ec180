"""`fp8bench e2e`'s command line: bad options are usage errors (exit 2, one message), no GPU is exit 1."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from fp8bench.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "llama4"], "unknown model 'llama4'"),
        (["--compile", "blocks"], "unknown compile mode"),
        (["--activation-checkpointing", "half"], "unknown activation checkpointing"),
        (["--lm-head", "fp4"], "unknown LM head precision"),
        (["--attention", "fast"], "unknown attention backend 'fast'; choose one of: flash, cudnn, efficient, math, auto"),
        (["--reshard-after-forward", "sometimes"], "unknown reshard-after-forward policy 'sometimes'; choose one of: default, never"),
        (["--implementation", "cublas"], "unknown implementation 'cublas'"),
        (["--recipe", "mxfp8"], "unknown recipe 'mxfp8'"),
        (["--model", "custom"], "--model custom needs --dim"),
        (["--layers", "0"], "layers"),
        (["--nproc-per-node", "0"], "nproc-per-node"),
        (["--one-gpu-baseline"], "--one-gpu-baseline measures a run on several GPUs against one: give --nproc-per-node 2 or more"),
        (["--nproc-per-node", "2", "--baseline-gpus", "2"], "--baseline-gpus 2 measures a run on --nproc-per-node GPUs against fewer: give --nproc-per-node more than 2"),
        (["--nproc-per-node", "4", "--baseline-gpus", "2", "--one-gpu-baseline"], "--one-gpu-baseline is --baseline-gpus 1: give one of the two"),
    ],
)
def test_cli_rejects_bad_options_with_exit_2(args, message):
    result = runner.invoke(app, ["e2e", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_cli_without_a_gpu_says_so_with_exit_1():
    result = runner.invoke(app, ["e2e", "--layers", "1"])
    assert result.exit_code == 1
    assert "CUDA GPU" in str(result.exception) or "CUDA GPU" in result.output


def test_the_committed_suite_names_valid_options():
    from pathlib import Path

    from fp8bench.harness.suite import load_suite

    suite = load_suite(Path(__file__).parent.parent / "suites" / "e2e.toml")
    assert suite.entries
    for entry in suite.entries:
        result = runner.invoke(app, entry.argv(Path("runs")))
        assert result.exit_code == 1, (entry.name, result.output)  # options parsed; only the GPU is missing


def test_several_gpus_relaunch_the_parsed_options_under_torchrun(tmp_path):
    from fp8bench.benchmarks.e2e import torchrun_command

    options = {"model": "llama3-8b", "layers": 4, "recipe": ["tensorwise", "rowwise"], "dim": None, "nproc_per_node": 2,
               "compile": "block", "out": None}  # fmt: skip
    command = torchrun_command(options, tmp_path / "run")
    assert command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    args = command[command.index("fp8bench.cli") + 1 :]
    assert args == ["e2e", "--out", str(tmp_path / "run"), "--model", "llama3-8b", "--layers", "4", "--recipe", "tensorwise",
                    "--recipe", "rowwise", "--nproc-per-node", "2", "--compile", "block"]  # fmt: skip
    result = runner.invoke(app, args)  # each rank parses them back (and here finds no GPU)
    assert result.exit_code == 1, result.output


def test_the_gates_rerun_plans_an_e2e_entry_with_its_own_settings(tmp_path, monkeypatch):
    """The gate's re-run builds the entry's benchmark by the command's own option parsing (nothing runs)."""
    import torch

    import fp8bench.cli as cli
    from fp8bench.benchmarks import e2e
    from fp8bench.harness.suite import load_suite

    suite = tmp_path / "e2e.toml"
    suite.write_text('name = "e2e"\n[[bench]]\nname = "proxy"\ncommand = "e2e"\nlayers = 2\nsteps = 4\nwarmup = 2\nimplementation = ["te"]\n'
                     'recipe = ["tensorwise"]\n')  # fmt: skip
    monkeypatch.setattr(cli, "require_cuda", lambda command: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(e2e, "GpuStepClock", lambda: "step clock")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    run_dir = tmp_path / "_reruns" / "proxy" / "case"
    benchmark, clock, timing = cli._plan(load_suite(suite).entries[0], run_dir)
    assert isinstance(benchmark, e2e.E2EBenchmark) and clock is None
    assert (benchmark.steps, benchmark.warmup, benchmark.load_te, benchmark.clock) == (4, 2, True, "step clock")
    assert benchmark.spec.key == "h100-sxm" and benchmark.run_dir == run_dir and benchmark.device == "cuda:0"
    case = benchmark.case_from_identity({"benchmark": "e2e", "case": "llama3-8b.L2.S8192.B1", "backend": "te", "recipe": "tensorwise",
                                         "world_size": "1", "compile": "block", "activation_checkpointing": "none", "lm_head": "bf16"})  # fmt: skip
    assert (case.steps, case.warmup) == (4, 2) and benchmark.reference_of(case).implementation == "bf16"
    assert not (tmp_path / "_reruns").exists()  # planning writes nothing


def test_torchrun_passes_a_flag_only_when_it_is_set(tmp_path):
    from fp8bench.benchmarks.e2e import torchrun_command

    for resume, expected in ((True, ["--resume"]), (False, [])):
        command = torchrun_command({"nproc_per_node": 2, "resume": resume}, tmp_path)
        assert command[command.index("fp8bench.cli") + 1 :] == ["e2e", "--out", str(tmp_path), "--nproc-per-node", "2", *expected]


def _launched(monkeypatch, tmp_path, args, returncodes, visible=None):
    """`fp8bench e2e ARGS` on a host that shows 4 GPUs, with the processes it starts recorded (and given
    `returncodes` in turn) instead of run."""
    import subprocess

    import torch

    import fp8bench.cli as cli

    started = []

    def run(command, env=None):
        started.append((command, env))
        return subprocess.CompletedProcess(command, returncodes[len(started) - 1])

    monkeypatch.setattr(cli, "require_cuda", lambda command: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(subprocess, "run", run)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    result = runner.invoke(app, ["e2e", "--out", str(tmp_path / "run"), *args])
    return result, started


def _e2e_args(command: list[str]) -> list[str]:
    return command[command.index("fp8bench.cli") + 1 :]


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_one_gpu_baseline_runs_the_cases_on_the_first_gpu_then_resumes_the_run_on_several(monkeypatch, tmp_path):
    result, started = _launched(monkeypatch, tmp_path, ["--layers", "2", "--nproc-per-node", "2", "--one-gpu-baseline"], [0, 0], visible="3,5")
    assert result.exit_code == 0, result.output
    (single, single_env), (several, several_env) = started
    assert single[1:3] == ["-m", "fp8bench.cli"] and single_env["CUDA_VISIBLE_DEVICES"] == "3"
    assert several[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"] and several_env["CUDA_VISIBLE_DEVICES"] == "3,5"
    for args, nproc, resumed in ((_e2e_args(single), "1", False), (_e2e_args(several), "2", True)):
        assert args[:3] == ["e2e", "--out", str(tmp_path / "run")] and _option(args, "--layers") == "2"
        assert _option(args, "--nproc-per-node") == nproc and ("--resume" in args) is resumed
        assert "--one-gpu-baseline" not in args


def test_a_baseline_of_k_gpus_runs_the_cases_on_the_first_k_then_resumes_the_run_on_all(monkeypatch, tmp_path):
    result, started = _launched(monkeypatch, tmp_path, ["--nproc-per-node", "4", "--baseline-gpus", "2"], [0, 0], visible="3,5,6,7")
    assert result.exit_code == 0, result.output
    (baseline, baseline_env), (several, several_env) = started
    assert baseline[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert baseline_env["CUDA_VISIBLE_DEVICES"] == "3,5" and several_env["CUDA_VISIBLE_DEVICES"] == "3,5,6,7"
    assert several[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4"]
    for args, nproc, resumed in ((_e2e_args(baseline), "2", False), (_e2e_args(several), "4", True)):
        assert _option(args, "--nproc-per-node") == nproc and ("--resume" in args) is resumed
        assert _option(args, "--baseline-gpus") == "0"
    result, started = _launched(monkeypatch, tmp_path, ["--nproc-per-node", "4", "--baseline-gpus", "3"], [0, 0])
    assert result.exit_code == 0 and started[0][1]["CUDA_VISIBLE_DEVICES"] == "0,1,2"


def test_a_failed_one_gpu_baseline_stops_before_the_run_on_several_gpus(monkeypatch, tmp_path):
    result, started = _launched(monkeypatch, tmp_path, ["--nproc-per-node", "2", "--one-gpu-baseline"], [3])
    assert result.exit_code == 3 and len(started) == 1
    assert started[0][1]["CUDA_VISIBLE_DEVICES"] == "0"


def test_several_gpus_without_a_baseline_start_one_torchrun_launch(monkeypatch, tmp_path):
    result, started = _launched(monkeypatch, tmp_path, ["--nproc-per-node", "4"], [0])
    assert result.exit_code == 0 and len(started) == 1
    args = _e2e_args(started[0][0])
    assert _option(args, "--nproc-per-node") == "4" and "--resume" not in args and started[0][1] == dict(os.environ)
