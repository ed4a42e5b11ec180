"""tools/gemm_beside_comm_probe.py's CPU-side logic: which products a block's training step runs, what an FP8
all-gather of the block moves, and the per-background summary."""

from __future__ import annotations

import pytest

from fp8bench.nn.llama import PRESETS

from tool_module import load_tool

probe = load_tool("gemm_beside_comm_probe")


def test_each_linear_runs_three_products_of_equal_work_in_training():
    products = probe.training_products(8192)
    assert [(p.linear, p.role) for p in products[:3]] == [("wqkv", "output"), ("wqkv", "grad_input"), ("wqkv", "grad_weight")]
    output, grad_input, grad_weight = (p.shape for p in products[:3])
    assert (output.M, output.K, output.N) == (8192, 4096, 6144)  # x[M, K] @ w[N, K]^T
    assert (grad_input.M, grad_input.K, grad_input.N) == (8192, 6144, 4096)  # g[M, N] @ w[N, K]
    assert (grad_weight.M, grad_weight.K, grad_weight.N) == (6144, 8192, 4096)  # g^T[N, M] @ x[M, K]
    assert [p.fast_accum for p in products[:3]] == [True, False, False]  # the tensorwise recipe's settings
    flops = [p.shape.M * p.shape.K * p.shape.N for p in products]
    assert all(flops[i] == flops[i + 1] == flops[i + 2] for i in range(0, len(flops), 3))
    assert sum(flops) == 3 * 8192 * PRESETS["llama3-8b"].block_linear_parameters()


def test_an_fp8_all_gather_of_a_block_moves_a_byte_per_linear_weight():
    assert probe.block_fp8_bytes() == PRESETS["llama3-8b"].block_linear_parameters()


def test_summary_gives_each_background_its_slowdown_over_the_calls_alone():
    times = {"none": [1.0, 1.1, 0.9, 1.0, 1.0], "allgather": [1.2, 1.1, 1.3, 1.2, 1.2], "memcpy": [1.0, 1.05, 1.0, 1.0, 1.0]}
    rows = {row["background"]: row for row in probe.summary(times, {"allgather": True, "memcpy": False})}
    assert rows["none"]["slowdown"] == 1.0 and rows["none"]["covered"]
    assert rows["allgather"]["slowdown"] == pytest.approx(1.2)
    assert rows["memcpy"]["slowdown"] == pytest.approx(1.0) and not rows["memcpy"]["covered"]
    assert rows["allgather"]["median_ms"] == pytest.approx(1.2)
    assert rows["allgather"]["spread_pct"] > 0


def test_the_background_outlasts_the_calls_by_half():
    assert probe.background_units(alone_ms=1.0, calls=20, unit_ms=3.0) == 10
    assert probe.background_units(alone_ms=0.01, calls=20, unit_ms=3.0) == 2


def _agree(rank: int, path: str) -> None:
    import torch

    mine = [7, 9][rank]  # each rank derived its own count from its own timings
    torch.save(probe.agreed_count(mine, torch.device("cpu")), f"{path}.{rank}")


def test_every_rank_issues_as_many_collectives_as_the_rank_that_needs_most(tmp_path):
    import torch

    from gloo_ranks import WORLD, spawn

    spawn(_agree, str(tmp_path / "count"))
    assert [torch.load(tmp_path / f"count.{rank}") for rank in range(WORLD)] == [9, 9]
