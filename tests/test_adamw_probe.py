"""tools/adamw_probe.py's CPU-side logic: parameter sets, the records' bytes and derived columns (with a
fake timer: a CPU gives no GPU numbers), and its refusal to run without a GPU."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from tool_module import load_tool

probe = load_tool("adamw_probe")

TINY = [(64, 40), (7,), (300,)]


class FakeTimers:
    """Runs each step once (the CPU path of every implementation is exercised) and reports made-up times,
    different for every call so that a record mixing up its numbers shows."""

    def __init__(self):
        self.calls = []

    def time(self, fn, steps, warmup):
        fn()
        self.calls.append((steps, warmup))
        return probe.Timed(kernel_ms=float(len(self.calls)), event_ms=1.5 * len(self.calls), launches=2, amax_kernel_ms=0.25 * len(self.calls))


def test_parameter_sets():
    shapes = probe.llama_1b_shapes()
    assert len(shapes) == 98 and sum(torch.Size(s).numel() for s in shapes) == 1_235_814_400
    shapes = probe.llama_25m_shapes()
    assert len(shapes) == 51 and 25e6 < sum(torch.Size(s).numel() for s in shapes) < 26e6


def test_records_count_bytes_and_derive_columns():
    timers = FakeTimers()
    records = probe.probe_set("tiny", TINY, timers, steps=50, warmup=3, sweep=True, variants=True, device="cpu")
    assert all(call == (50, 3) for call in timers.calls)
    frame = pd.DataFrame.from_records(records).set_index("implementation", drop=False)
    numel = 64 * 40 + 7 + 300
    assert (frame.params == numel).all() and (frame.tensors == 3).all()
    per_param = {name: (row.update_bytes_per_param, row.amax_bytes_per_param) for name, row in frame.iterrows() if name != "copy"}
    assert per_param["torch-fused-adamw"] == (28, 0)
    assert per_param["ours-e4m3-sqrt-e5m2"] == (16, 4) and per_param["ours-e4m3-fp16"] == (18, 4)
    # A copy of as many bytes as each format moves (28, 20, 22 per parameter), timed once per byte count.
    copies = frame[frame.implementation == "copy"]
    assert sorted(copies.update_bytes_per_param) == [20, 22, 28]
    fused = frame.loc["torch-fused-adamw"]
    assert fused.kernel_gbps == pytest.approx(28 * numel / (fused.kernel_ms * 1e6))
    assert fused.pct_copy_kernel == pytest.approx(100 * fused.kernel_gbps / fused.copy_gbps)
    ours = frame.loc["ours-e4m3-sqrt-e5m2"]
    assert ours.speedup_vs_torch_kernel == pytest.approx(fused.kernel_ms / ours.kernel_ms)
    assert ours.pct_copy_event == pytest.approx(100 * 20 * numel / (ours.event_ms * 1e6) / ours.copy_gbps)
    assert ours.amax_kernel_ms == pytest.approx(0.25 * ours.kernel_ms) and pd.isna(fused.amax_kernel_ms)
    swept = frame[frame.implementation.str.endswith("-kernels")]
    assert swept.block.notna().all() and len(swept) > 2
    # Each variant of the update kernel, in the first format, at the default config.
    variants = {f"ours-e4m3-sqrt-e5m2-{name}" for name in probe.VARIANTS}
    assert variants <= set(frame.implementation) and (frame.loc[list(variants)].block == ours.block).all()


def test_cli_refuses_without_a_gpu_and_names_bad_sets(tmp_path):
    result = CliRunner().invoke(probe.app, [str(tmp_path / "out.csv"), "--set", "llama-7t"])
    assert result.exit_code == 2 and "unknown parameter set 'llama-7t'" in result.output
    if not torch.cuda.is_available():
        result = CliRunner().invoke(probe.app, [str(tmp_path / "out.csv")])
        assert result.exit_code == 2 and "needs a CUDA GPU" in result.output
        assert not (tmp_path / "out.csv").exists()
