"""tools/fsdp_probe.py's CPU-side logic: which communication a profiled trace shows the compute stream
waiting for, and the scaling efficiency against the one-GPU rows."""

from __future__ import annotations

import pandas as pd
import pytest

from tool_module import load_tool

probe = load_tool("fsdp_probe")


def _kernel(name: str, start: float, duration: float, stream: int) -> dict:
    return {"cat": "kernel", "ph": "X", "name": name, "ts": start, "dur": duration, "args": {"stream": stream}}


def test_exposed_communication_is_nccl_time_while_the_compute_stream_is_idle():
    # Compute stream 7 runs [0, 10) and [15, 25) (a GEMM and an attention kernel); the all-gather [5, 20)
    # is hidden but for [10, 15), the reduce-scatter [24, 30) but for [25, 30); a copy on FSDP2's stream
    # and a CPU event do not count as compute.
    trace = {"traceEvents": [
        _kernel("nvjet_sm90_tst_256x128", 0, 10, 7), _kernel("pytorch_flash::flash_fwd_kernel", 15, 10, 7),
        _kernel("ncclDevKernel_AllGather_RING_LL", 5, 15, 20), _kernel("ncclDevKernel_ReduceScatter_Sum_f32", 24, 6, 21),
        _kernel("chunk_cat_cuda_kernel", 12, 1, 20), {"cat": "cpu_op", "ph": "X", "name": "aten::mm", "ts": 0, "dur": 100},
    ]}  # fmt: skip
    row = probe.overlap_breakdown(trace, steps=2)
    us_per_step = {key: value * 1e3 * 2 for key, value in row.items()}  # back to microseconds over both steps
    assert us_per_step == pytest.approx({
        "nccl_ms": 21, "compute_busy_ms": 20, "compute_idle_ms": 10, "exposed_comm_ms": 10, "attention_ms": 10,
        "exposed_allgather_ms": 5, "exposed_reducescatter_ms": 5, "exposed_allreduce_ms": 0,
        "compute_gemm_ms": 10, "compute_attention_ms": 10, "compute_cast_ms": 0, "compute_norm_act_ms": 0,
        "compute_optimizer_ms": 0, "compute_comm_ms": 0, "compute_other_ms": 0,
    })  # fmt: skip


def test_a_trace_without_kernels_is_an_error():
    with pytest.raises(ValueError, match="no GPU kernels"):
        probe.overlap_breakdown({"traceEvents": [{"cat": "cpu_op", "ph": "X", "name": "aten::mm", "ts": 0, "dur": 1}]}, 1)


def test_scaling_efficiency_is_the_one_gpu_step_time_over_the_sharded_one(tmp_path):
    same = {"layers": 4, "seq_len": 8192, "compile": "block", "checkpointing": "none"}
    baseline = tmp_path / "one.csv"
    pd.DataFrame([
        {"implementation": "bf16", "world_size": 1, "step_ms": 140.0, **same},
        {"implementation": "triton", "world_size": 1, "step_ms": 120.0, **same},
        {"implementation": "bf16", "world_size": 1, "step_ms": 999.0, **same, "layers": 2},  # another model: not joined
    ]).to_csv(baseline, index=False)  # fmt: skip
    table = pd.DataFrame([
        {"implementation": "bf16", "plan": "prefetch-1", "world_size": 2, "step_ms": 147.0, **same},
        {"implementation": "triton", "plan": "prefetch-1", "world_size": 2, "step_ms": 150.0, **same},
    ])  # fmt: skip
    joined = probe.with_efficiency(table, str(baseline))
    assert list(joined["efficiency_pct"]) == pytest.approx([100 * 140 / 147, 80.0])
    assert list(joined["plan"]) == ["prefetch-1", "prefetch-1"]
