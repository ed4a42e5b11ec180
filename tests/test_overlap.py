"""fp8bench.harness.overlap: the compute stream's idle time and the communication nothing overlaps, from
kernels' intervals on several streams."""

from __future__ import annotations

import pytest

from fp8bench.harness.overlap import compute_stream, merged, outside, stream_overlap
from fp8bench.harness.timing import KernelRecord, kernel_ms_by_name


def _nccl(name: str) -> bool:
    return "nccl" in name


def test_merged_joins_touching_and_overlapping_intervals_in_order():
    assert merged([(5, 7), (0, 2), (1, 3), (3, 4), (9, 10)]) == [(0, 4), (5, 7), (9, 10)]
    assert merged([]) == []


def test_outside_is_the_union_of_the_intervals_less_what_the_cover_covers():
    cover = merged([(0, 10), (15, 25)])
    assert outside([(5, 20)], cover) == 5  # [10, 15)
    assert outside([(5, 20), (8, 12)], cover) == 5  # counted once
    assert outside([(24, 30), (40, 41)], cover) == 6  # [25, 30) and [40, 41)
    assert outside([(0, 10)], []) == 10


def test_a_step_on_two_streams_gives_the_idle_compute_and_the_exposed_collectives():
    # ns. Compute stream 7: [0, 100) and [150, 250). NCCL on stream 20: an all-gather [50, 200) (exposed
    # [100, 150)) and a reduce-scatter [240, 300) (exposed [250, 300)). A copy on stream 20 is not compute.
    records = [
        KernelRecord("gemm", 0, 100, 7), KernelRecord("attention", 150, 100, 7),
        KernelRecord("ncclAllGather", 50, 150, 20), KernelRecord("ncclReduceScatter", 240, 60, 20),
        KernelRecord("chunk_cat", 120, 10, 20),
    ]  # fmt: skip
    assert compute_stream(records, _nccl) == 7
    overlap = stream_overlap(records, _nccl, steps=2)
    assert overlap.compute_busy_ms == pytest.approx(200 / 1e6 / 2)
    assert overlap.compute_idle_ms == pytest.approx(100 / 1e6 / 2)  # span 300 less 200 busy
    assert overlap.exposed_comm_ms == pytest.approx(100 / 1e6 / 2)  # [100, 150) and [250, 300)
    assert overlap.compute_stream == 7 and overlap.busy == ((0, 100), (150, 250))
    assert overlap.exposed_ms([(240, 300)]) == pytest.approx(50 / 1e6 / 2)  # the reduce-scatter alone


def test_one_stream_has_no_exposed_communication_and_only_collectives_are_an_error():
    alone = stream_overlap([KernelRecord("gemm", 0, 10, 3), KernelRecord("cast", 15, 5, 3)], _nccl)
    assert (alone.compute_busy_ms, alone.compute_idle_ms, alone.exposed_comm_ms) == pytest.approx((15e-6, 5e-6, 0.0))
    with pytest.raises(ValueError, match="no compute stream"):
        stream_overlap([KernelRecord("ncclAllGather", 0, 10, 20)], _nccl)


def test_kernel_time_by_name_is_the_mean_per_call_of_each_name():
    two_calls = [KernelRecord("gemm", 0, 3_000_000, 7), KernelRecord("cast", 3_000_000, 1_000_000, 7),
                 KernelRecord("gemm", 9_000_000, 5_000_000, 7)]  # fmt: skip
    assert kernel_ms_by_name(two_calls, calls=2) == pytest.approx({"gemm": 4.0, "cast": 0.5})
    assert kernel_ms_by_name(two_calls[:2]) == pytest.approx({"gemm": 3.0, "cast": 1.0})
