"""TMA multicast across a 2-CTA cluster from Gluon on Triton 3.6: a probe, not a kernel of fp8kernels.

    python tools/gluon_multicast_probe.py ptx                    # CPU: compile for sm_90a, check PTX and SASS
    python tools/gluon_multicast_probe.py run [--m --n --k]      # sm_90 GPU: every variant against the reference

The kernels are an FP8 GEMM (e4m3 x e4m3 -> fp32) whose program is a cluster of two CTAs (`num_ctas=2`):
the cluster owns a 128 x BLOCK_N tile, each CTA 64 of its rows (one consumer warpgroup, one m64 wgmma per
K-tile), and both CTAs need the same B tile. Triton 3.6 lowers a TMA load into a shared buffer whose
`cga_layout` broadcasts (`[[0, 0]]`) as one ordinary load per CTA (each CTA fetches the whole tile: no
`.multicast`), and a split layout (`[[1, 0]]`) as one load per CTA of its own part. So with MULTICAST the B
tile comes from inline PTX instead: each CTA issues

    cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster

for its half of the rows (a BLOCK_N/2 x BLOCK_K box), with CTA mask 0b11, so each half lands in both
CTAs' shared memory at the same offset and signals both CTAs' `ready` barrier at the same offset: each
CTA's barrier expects its own A bytes plus the whole B tile, half from each CTA. What the language does
not give, and how the probe gets it:

- the tensor map's address: a descriptor cannot be an operand of `inline_asm_elementwise` (its verifier
  takes integers, floats and pointers), so the asm names the kernel parameter itself
  (`<kernel>_param_0` + `cvta.param`, what Triton's own TMA lowering emits): the B-half descriptor is
  the kernel's first argument;
- shared-memory addresses: Gluon has no memdesc -> address op, so the asm adds to `global_smem` (the
  symbol Triton allocates from) the offsets Triton's allocator gave the buffers. `compile_probe` compiles
  once, runs the allocation pass on that TTGIR to read `allocation.offset` of each named buffer,
  compiles again with those offsets as constexprs and checks that the allocation did not move;
- a ring slot may be refilled only when both CTAs have read it: each CTA's `empty` barrier counts two
  arrivals, its own consumer's (`mbarrier.arrive`) and the peer's (`mapa` + `mbarrier.arrive.shared::cluster`,
  inline), with the arrive's default CTA-scope release: the slot's reads were the wgmma's, waited for before it.
  A cluster-scope release (`.release.cluster`) compiled to `MEMBAR.ALL.GPU` + `ERRBAR` per K-tile, and at 4096^3
  the multicast variants ran 1.8x / 2.0x the per-CTA ones' time, with those instructions holding their warps
  (Nsight Compute: reports/h100-sxm/gluon-multicast-probe);
- cluster barriers (`fence.mbarrier_init.release.cluster`, `barrier.cluster.arrive/wait`): after the
  barriers are initialised, before any CTA may signal its peer's, and before exit, so no CTA leaves while
  its peer may still arrive on its barriers (Gluon 3.6 exposes none of them).

Two kernels, each with and without MULTICAST (without, B comes through Gluon's own TMA copy, each CTA
the whole tile): `_multicast_gemm_kernel`, one 4-warp partition issuing loads NUM_STAGES - 1 K-tiles
ahead of its wgmma; and `_multicast_gemm_ws_kernel`, warp-specialised as kernels/_gemm_ws.py is (a
consumer warpgroup and a producer partition), with the producer a whole warpgroup so that every launched
warp runs a partition and reaches the cluster barriers. The one-partition kernel without MULTICAST is the
reference: `run` checks it against torch's fp32 product of the same FP8 operands and every other variant
against it bit for bit (same products, same order), exits 1 on a mismatch, then times all four. `ptx`
exits 1 unless each multicast variant has the multicast instruction and the cluster barriers in its PTX,
`UTMALDG.2D.MULTICAST` in its SASS, and Triton's own barrier initialisations at the offsets its inline
PTX assumes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import triton
import typer
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.tools.disasm import get_sass

from fp8bench.config import TimingConfig
from fp8bench.harness.timing import TimerChoice
from fp8kernels._cluster import (BARRIER_BYTES, HOPPER, arrive_peer, asm, barrier_inits, cluster_end, cluster_start,
                                 compile_at_offsets, multicast_rows_ptx)
from fp8kernels.gemm import GLUON_TRITON_RELEASES

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, help=__doc__.split("\n\n")[0])

CTAS = 2
OPTIONS = {"num_warps": 4, "num_ctas": CTAS}
CTA_ROWS = 64  # one warpgroup per CTA, one m64 wgmma
BLOCK_M = CTAS * CTA_ROWS  # rows of the cluster's tile
BLOCK_N = 128
BLOCK_K = 128
STAGES = 4
# The PTX entries' names (the kernels' Python names): the inline PTX addresses each kernel's first
# parameter as NAME_param_0.
KERNEL_NAME = gl.constexpr("_multicast_gemm_kernel")
WS_KERNEL_NAME = gl.constexpr("_multicast_gemm_ws_kernel")
PRODUCER_REGISTERS = gl.constexpr(40)
# The buffers whose shared-memory offsets the inline PTX needs, by their names in the kernel.
ADDRESSED = ("b_bufs", "ready", "empty")
# Instructions the multicast variant's PTX must hold (its SASS: UTMALDG.2D.MULTICAST).
MULTICAST_PTX = (
    "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster",
    "mapa.shared::cluster.u32",
    "mbarrier.arrive.shared::cluster.b64",
    "fence.mbarrier_init.release.cluster",
    "barrier.cluster.arrive.release.aligned",
    "barrier.cluster.wait.acquire.aligned",
    ".reqnctapercluster 2",
)


@gluon.jit
def _load_k_tile(b_half_desc, a_desc, b_desc, a_bufs, b_bufs, ready, empty, pid_m, pid_n, i, KERNEL: gl.constexpr,
                 MULTICAST: gl.constexpr, B_OFFSET: gl.constexpr, READY_OFFSET: gl.constexpr):
    """K-tile i of the cluster's tile into ring slot i % STAGES, once both CTAs have read the slot."""
    NUM_STAGES: gl.constexpr = empty.type.shape[0]
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    SLOT_BYTES: gl.constexpr = b_desc.block_type.nbytes
    slot = i % NUM_STAGES
    mbarrier.wait(empty.index(slot), ((i // NUM_STAGES) & 1) ^ 1)
    # This CTA's rows of A (a_desc's layout splits the cluster's rows between the CTAs) and all of B.
    mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes // 2 + b_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(a_desc, [pid_m * BM, i * BK], ready.index(slot), a_bufs.index(slot))
    if MULTICAST:
        half_ptx: gl.constexpr = multicast_rows_ptx(KERNEL, 0, b_half_desc.block_type.shape[0],
                                                    b_half_desc.block_type.nbytes, 128)
        asm(half_ptx, "=r,r,r,r,r", [B_OFFSET + slot * SLOT_BYTES, READY_OFFSET + slot * BARRIER_BYTES, pid_n * BN, i * BK])
    else:
        tma.async_copy_global_to_shared(b_desc, [pid_n * BN, i * BK], ready.index(slot), b_bufs.index(slot))


@gluon.jit
def _consume_k_tile(a_bufs, b_bufs, ready, empty, acc, ki, MULTICAST: gl.constexpr, EMPTY_OFFSET: gl.constexpr):
    """acc + this CTA's rows of A @ B.T for K-tile ki; then hand its slot back (to both CTAs' producers)."""
    NUM_STAGES: gl.constexpr = empty.type.shape[0]
    slot = ki % NUM_STAGES
    mbarrier.wait(ready.index(slot), (ki // NUM_STAGES) & 1)
    acc = warpgroup_mma(a_bufs.index(slot), b_bufs.index(slot).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    mbarrier.arrive(empty.index(slot))
    if MULTICAST:
        arrive_peer(EMPTY_OFFSET + slot * BARRIER_BYTES, 128)
    return acc


@gluon.jit
def _store_tile(acc, c_ptr, M, N, pid_m, pid_n):
    """This CTA's rows of the fp32 tile (the accumulator's layout splits them between the CTAs)."""
    BM: gl.constexpr = acc.shape[0]
    BN: gl.constexpr = acc.shape[1]
    rows = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, acc.type.layout))
    cols = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, acc.type.layout))
    gl.store(c_ptr + rows[:, None] * N + cols[None, :], acc, mask=(rows[:, None] < M) & (cols[None, :] < N))


@gluon.jit
def _allocate(a_desc, b_desc, BARRIER_LAYOUT: gl.constexpr, MULTICAST: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The rings and their barriers, initialised: `empty` counts this CTA's consumer and, with MULTICAST,
    the peer's."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES, BM, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES, BN, BK], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], BARRIER_LAYOUT)
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], BARRIER_LAYOUT)
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2 if MULTICAST else 1)
    return a_bufs, b_bufs, ready, empty


@gluon.jit
def _multicast_gemm_kernel(b_half_desc, a_desc, b_desc, c_ptr, M, N, K, ACC_LAYOUT: gl.constexpr,
                           BARRIER_LAYOUT: gl.constexpr, MULTICAST: gl.constexpr, NUM_STAGES: gl.constexpr,
                           B_OFFSET: gl.constexpr, READY_OFFSET: gl.constexpr, EMPTY_OFFSET: gl.constexpr):
    """One partition (4 warps) per CTA: loads issued NUM_STAGES - 1 K-tiles ahead of the wgmma."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    a_bufs, b_bufs, ready, empty = _allocate(a_desc, b_desc, BARRIER_LAYOUT, MULTICAST, NUM_STAGES)
    if MULTICAST:
        cluster_start()
    pid_m = gl.program_id(0)  # with num_ctas=2 a program is a cluster
    pid_n = gl.program_id(1)
    k_tiles = gl.cdiv(K, BK)
    acc = gl.zeros([BM, BN], gl.float32, ACC_LAYOUT)
    for i in gl.static_range(NUM_STAGES - 1):
        if i < k_tiles:
            _load_k_tile(b_half_desc, a_desc, b_desc, a_bufs, b_bufs, ready, empty, pid_m, pid_n, i,
                         KERNEL_NAME, MULTICAST, B_OFFSET, READY_OFFSET)
    for ki in range(k_tiles):
        # Refill the slot read in the previous iteration (by both CTAs, when multicasting).
        if ki + NUM_STAGES - 1 < k_tiles:
            _load_k_tile(b_half_desc, a_desc, b_desc, a_bufs, b_bufs, ready, empty, pid_m, pid_n,
                         ki + NUM_STAGES - 1, KERNEL_NAME, MULTICAST, B_OFFSET, READY_OFFSET)
        acc = _consume_k_tile(a_bufs, b_bufs, ready, empty, acc, ki, MULTICAST, EMPTY_OFFSET)
    _store_tile(acc, c_ptr, M, N, pid_m, pid_n)
    if MULTICAST:
        cluster_end()


@gluon.jit
def _ws_consumer(a_bufs, b_bufs, ready, empty, c_ptr, M, N, K, ACC_LAYOUT: gl.constexpr, MULTICAST: gl.constexpr,
                 EMPTY_OFFSET: gl.constexpr):
    BM: gl.constexpr = a_bufs.type.shape[1]
    BN: gl.constexpr = b_bufs.type.shape[1]
    BK: gl.constexpr = a_bufs.type.shape[2]
    if MULTICAST:
        cluster_start()
    acc = gl.zeros([BM, BN], gl.float32, ACC_LAYOUT)
    for ki in range(gl.cdiv(K, BK)):
        acc = _consume_k_tile(a_bufs, b_bufs, ready, empty, acc, ki, MULTICAST, EMPTY_OFFSET)
    _store_tile(acc, c_ptr, M, N, gl.program_id(0), gl.program_id(1))
    if MULTICAST:
        cluster_end()


@gluon.jit
def _ws_producer(b_half_desc, a_desc, b_desc, a_bufs, b_bufs, ready, empty, K, MULTICAST: gl.constexpr,
                 B_OFFSET: gl.constexpr, READY_OFFSET: gl.constexpr):
    BK: gl.constexpr = a_desc.block_type.shape[1]
    if MULTICAST:
        cluster_start()
    for i in range(gl.cdiv(K, BK)):
        _load_k_tile(b_half_desc, a_desc, b_desc, a_bufs, b_bufs, ready, empty, gl.program_id(0), gl.program_id(1), i,
                     WS_KERNEL_NAME, MULTICAST, B_OFFSET, READY_OFFSET)
    if MULTICAST:
        cluster_end()


@gluon.jit
def _multicast_gemm_ws_kernel(b_half_desc, a_desc, b_desc, c_ptr, M, N, K, ACC_LAYOUT: gl.constexpr,
                              BARRIER_LAYOUT: gl.constexpr, MULTICAST: gl.constexpr, NUM_STAGES: gl.constexpr,
                              B_OFFSET: gl.constexpr, READY_OFFSET: gl.constexpr, EMPTY_OFFSET: gl.constexpr):
    """Warp-specialised, as kernels/_gemm_ws.py: the consumer warpgroup (default partition) and a producer
    of a whole warpgroup (4 warps, one thread issuing), so every launched warp runs a partition and takes
    part in the cluster barriers (a 1-warp producer would leave 3 idle warps that never arrive)."""
    a_bufs, b_bufs, ready, empty = _allocate(a_desc, b_desc, BARRIER_LAYOUT, MULTICAST, NUM_STAGES)
    gl.warp_specialize(
        [
            (_ws_consumer, (a_bufs, b_bufs, ready, empty, c_ptr, M, N, K, ACC_LAYOUT, MULTICAST, EMPTY_OFFSET)),
            (_ws_producer, (b_half_desc, a_desc, b_desc, a_bufs, b_bufs, ready, empty, K, MULTICAST, B_OFFSET,
                            READY_OFFSET)),
        ],
        [4],
        [PRODUCER_REGISTERS],
    )


def _require_gluon_release() -> None:
    """The probe is written against Triton 3.6's Gluon (its API and lowering change between releases)."""
    if not triton.__version__.startswith(GLUON_TRITON_RELEASES):
        print(f"gluon_multicast_probe: needs Triton {' or '.join(GLUON_TRITON_RELEASES)}x, found {triton.__version__}")
        raise typer.Exit(2)


@dataclass(frozen=True)
class Variant:
    specialized: bool  # _multicast_gemm_ws_kernel, else _multicast_gemm_kernel
    multicast: bool  # B by TMA multicast (inline PTX), else by Gluon's TMA copy in each CTA

    def __str__(self) -> str:
        return f"{'warp-specialised' if self.specialized else 'one partition'}, {'multicast' if self.multicast else 'per-CTA'} B"


# The first is the reference: the others must reproduce its output bit for bit.
VARIANTS = tuple(Variant(specialized, multicast) for specialized in (False, True) for multicast in (False, True))


@dataclass(frozen=True)
class Probe:
    """One compiled variant: the kernel and the shared-memory offsets its inline PTX was built with."""
    variant: Variant
    kernel: object
    offsets: dict[str, int]


def layouts():
    """The cluster's layouts: A's rows split between the CTAs, B broadcast (both hold the whole tile; with
    MULTICAST the B-half descriptor's box is half of it), the accumulator split like A, barriers per CTA."""
    split = [[1, 0]]
    broadcast = [[0, 0]]
    a = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2, cga_layout=split)
    b = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2, cga_layout=broadcast)
    acc = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 32],
                                    cga_layout=split)
    barrier = mbarrier.MBarrierLayout(cga_layout=[[0]])
    return a, b, acc, barrier


def _signature(a, b):
    return {
        "b_half_desc": f"tensordesc<fp8e4nv[{BLOCK_N // 2}, {BLOCK_K}],{b!r}>",
        "a_desc": f"tensordesc<fp8e4nv[{BLOCK_M}, {BLOCK_K}],{a!r}>",
        "b_desc": f"tensordesc<fp8e4nv[{BLOCK_N}, {BLOCK_K}],{b!r}>",
        "c_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
        "ACC_LAYOUT": "constexpr", "BARRIER_LAYOUT": "constexpr", "MULTICAST": "constexpr", "NUM_STAGES": "constexpr",
        "B_OFFSET": "constexpr", "READY_OFFSET": "constexpr", "EMPTY_OFFSET": "constexpr",
    }


def _compile(variant: Variant, offsets: dict[str, int]):
    a, b, acc, barrier = layouts()
    constants = {"ACC_LAYOUT": acc, "BARRIER_LAYOUT": barrier, "MULTICAST": variant.multicast, "NUM_STAGES": STAGES,
                 "B_OFFSET": offsets["b_bufs"], "READY_OFFSET": offsets["ready"], "EMPTY_OFFSET": offsets["empty"]}
    kernel = _multicast_gemm_ws_kernel if variant.specialized else _multicast_gemm_kernel
    source = GluonASTSource(kernel, _signature(a, b), constants)
    return triton.compile(source, target=HOPPER, options=OPTIONS)


def compile_probe(variant: Variant) -> Probe:
    """Compile the variant; a multicast one twice: once to learn the buffers' offsets, once with them."""
    if not variant.multicast:
        placeholder = dict.fromkeys(ADDRESSED, 0)
        return Probe(variant, _compile(variant, placeholder), placeholder)
    return Probe(variant, *compile_at_offsets(lambda offsets: _compile(variant, offsets), ADDRESSED, OPTIONS))


def _problems(probe: Probe) -> list[str]:
    """What the multicast variant's PTX, SASS or barrier offsets lack."""
    text = probe.kernel.asm["ptx"]
    problems = [f"PTX lacks {instruction}" for instruction in MULTICAST_PTX if instruction not in text]
    ring = [probe.offsets[name] + s * BARRIER_BYTES.value for name in ("ready", "empty") for s in range(STAGES)]
    if barrier_inits(probe.kernel) != {1: ring[:STAGES], 2: ring[STAGES:]}:
        problems.append(f"Triton initialises its barriers at {barrier_inits(probe.kernel)}, the inline PTX "
                        f"assumes ready / empty at {ring}")
    if "UTMALDG.2D.MULTICAST" not in get_sass(probe.kernel.asm["cubin"]):
        problems.append("SASS lacks UTMALDG.2D.MULTICAST")
    return problems


@app.command()
def ptx():
    """Compile every variant for sm_90a (no GPU needed: the wheel's ptxas assembles the PTX) and show the
    cluster, barrier and TMA instructions of their PTX and SASS."""
    _require_gluon_release()
    failed = False
    for variant in VARIANTS:
        probe = compile_probe(variant)
        boxes = [meta["block_size"] for meta in probe.kernel.metadata.tensordesc_meta]
        threads = re.search(r"\.reqntid (\d+)", probe.kernel.asm["ptx"]).group(1)
        print(f"== {variant}: {threads} threads a CTA, offsets {probe.offsets}, {probe.kernel.metadata.shared} B of "
              f"shared memory, TMA boxes per CTA (b_half, a, b) {boxes}")
        lines = probe.kernel.asm["ptx"].splitlines() + get_sass(probe.kernel.asm["cubin"]).splitlines()
        shown = r"cp\.async\.bulk\.tensor|mapa|barrier\.cluster|fence\.mbarrier_init|mbarrier\.(init|arrive)|" \
                r"reqnctapercluster|UTMALDG|UCGABAR|SYNCS\.ARRIVE"
        for line in dict.fromkeys(line.strip() for line in lines if re.search(shown, line)):
            print("   ", line)
        if variant.multicast:
            for problem in _problems(probe):
                print(f"missing: {problem}")
                failed = True
    raise typer.Exit(1 if failed else 0)


def launch(probe: Probe, a, b_t, out):
    """out = a @ b_t.T in fp32: one cluster per 128 x BLOCK_N tile."""
    M, K = a.shape
    N = b_t.shape[0]
    a_layout, b_layout, acc, barrier = layouts()
    a_desc = TensorDescriptor.from_tensor(a, [BLOCK_M, BLOCK_K], a_layout)
    b_desc = TensorDescriptor.from_tensor(b_t, [BLOCK_N, BLOCK_K], b_layout)
    b_half_desc = TensorDescriptor.from_tensor(b_t, [BLOCK_N // 2, BLOCK_K], b_layout)
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N), 1)
    probe.kernel[grid](b_half_desc, a_desc, b_desc, out, M, N, K, acc, barrier, probe.variant.multicast, STAGES,
                       probe.offsets["b_bufs"], probe.offsets["ready"], probe.offsets["empty"])


# The tensor cores sum FP8 products with fewer mantissa bits than fp32 (our fast-accumulation GEMM is
# 3.9e-3 from the fp32 product at K 16384, kernels/README.md), so the reference check only catches wrong
# data; the other variants must then equal the reference bit for bit (same products, same order).
REFERENCE_TOLERANCE = 1e-2


@app.command()
def run(m: int = 4096, n: int = 4096, k: int = 4096, seed: int = 0, time: bool = True):
    """On an sm_90 GPU: every variant on the same FP8 operands, the reference against torch's fp32 product
    and the others against it, then (with --time) timed by fp8bench.harness.timing (CUPTI kernel time)."""
    _require_gluon_release()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("run needs an sm_90 GPU (H100 / H200); `ptx` compiles without one")
        raise typer.Exit(2)
    torch.manual_seed(seed)
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b_t = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    reference = a.float() @ b_t.float().T
    probes = [compile_probe(variant) for variant in VARIANTS]
    outputs = []
    for probe in probes:
        out = torch.full((m, n), float("nan"), device="cuda")
        launch(probe, a, b_t, out)
        torch.cuda.synchronize()
        outputs.append(out)
        error = ((out - reference).norm() / reference.norm()).item()
        print(f"{probe.variant}: M {m} N {n} K {k}: relative Frobenius error to the fp32 product {error:.3e}")
    failed = not ((outputs[0] - reference).norm() / reference.norm()).item() <= REFERENCE_TOLERANCE
    for probe, out in zip(probes[1:], outputs[1:]):
        identical = torch.equal(out, outputs[0])
        failed |= not identical
        print(f"{probe.variant}: {'equals' if identical else 'DIFFERS FROM'} {probes[0].variant} bit for bit")
    if failed:
        raise typer.Exit(1)
    if time:
        timer = TimerChoice("cupti")
        for probe, out in zip(probes, outputs):
            measurement = timer.measure(lambda: launch(probe, a, b_t, out), TimingConfig())
            tflops = 2 * m * n * k / (measurement.median_ms * 1e-3) / 1e12
            print(f"{probe.variant}: {measurement.median_ms:.4f} ms (spread {measurement.spread_pct:.1f}%), "
                  f"{tflops:.0f} TFLOPS on {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    app()
