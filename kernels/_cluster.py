"""What a Gluon kernel on Triton 3.6 needs to run as a cluster of two CTAs that multicast TMA loads, and the
language does not give: inline PTX for the cluster barrier, the peer's mbarrier and the multicast load, and the
shared-memory offsets Triton's allocator gives the buffers those address. Used by kernels/_gemm_ws.py
(config.cluster_m 2) and tools/gluon_multicast_probe.py, where each piece was first measured
(reports/h100-sxm/gluon-multicast-probe).

- Shared-memory addresses: Gluon has no memdesc -> address op, so the PTX adds to `global_smem` (the symbol Triton
  allocates from) the offsets of the buffers. `allocation_offsets` runs Triton's allocation pass on a first
  compile's TTGIR; the kernel is compiled again with them as constexprs, and `barrier_inits` checks them against
  the offsets Triton's own `mbarrier.init` lowering uses.
- A tensor map cannot be an operand of `inline_asm_elementwise` (its verifier takes integers, floats and
  pointers), so the multicast load names the kernel parameter itself (`<kernel>_param_<i>` + `cvta.param`, as
  Triton's own TMA lowering does).
- The peer's arrive uses the default CTA-scope release: the slot's reads were the wgmma's, waited for before it.
  A cluster-scope release (`.release.cluster`) compiles to `MEMBAR.ALL.GPU` + `ERRBAR` and made the probe's
  multicast kernels 1.7-2.1x slower.
- `barrier.cluster` waits for every thread of the cluster that has not exited, so every partition of a
  warp-specialized kernel runs `cluster_start`, and none of its warps may be left idle before it.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

HOPPER = GPUTarget("cuda", 90, 32)
BARRIER_BYTES = gl.constexpr(8)

# Every thread of both CTAs: this CTA's barrier initialisations become visible cluster-wide, then it waits for
# the peer (its barriers initialised). The fence orders the initialisations, so the arrive is relaxed, as CUTLASS
# starts its clusters: a release arrive compiles to MEMBAR.ALL.GPU + ERRBAR in every partition.
_CLUSTER_START_PTX = gl.constexpr("""{
fence.mbarrier_init.release.cluster;
barrier.cluster.arrive.relaxed.aligned;
barrier.cluster.wait.acquire.aligned;
mov.u32 $0, 0;
}""")
# Before exit: wait until the peer is done with this CTA's barriers and shared memory (the probe's kernels; the GEMM's
# producer waits for its ring's slots instead, kernels/_gemm_ws.py).
_CLUSTER_END_PTX = gl.constexpr("""{
barrier.cluster.arrive.release.aligned;
barrier.cluster.wait.acquire.aligned;
mov.u32 $0, 0;
}""")


@gluon.constexpr_function
def _one_thread_ptx(threads: int, pred: str, scratch: str) -> str:
    """PTX setting `pred` in one thread of each `threads`. A warp's is `elect.sync`: with a thread-index test
    instead, ptxas kept the kernel's parameter base in a vector register, and every TMA issue of the warp-specialised
    GEMM's producer became a loop over lanes (ELECT ... BRA.U.ANY: 187 instructions a K-tile against 93), which
    made the producer the cluster's bottleneck (reports/h100-sxm/gemm-multicast-elect)."""
    if threads == 32:
        return f"elect.sync _|{pred}, -1;"
    return f"mov.u32 {scratch}, %tid.x;\nand.b32 {scratch}, {scratch}, {threads - 1};\nsetp.eq.u32 {pred}, {scratch}, 0;"


@gluon.constexpr_function
def arrive_peer_ptx(threads: int) -> str:
    """One thread of each `threads` (the arriving warp or warpgroup) arrives on the peer CTA's barrier at
    `global_smem + $1` (its own at that offset, mapped into the peer's shared memory)."""
    return f"""{{
.reg .b32 %ap<3>;
.reg .pred %app;
{_one_thread_ptx(threads, "%app", "%ap0")}
mov.u32 %ap1, global_smem;
add.u32 %ap1, %ap1, $1;
mov.u32 %ap2, %cluster_ctarank;
xor.b32 %ap2, %ap2, 1;
mapa.shared::cluster.u32 %ap1, %ap1, %ap2;
@%app mbarrier.arrive.shared::cluster.b64 _, [%ap1];
mov.u32 $0, 0;
}}"""

_CTA_RANK_PTX = gl.constexpr("mov.u32 $0, %cluster_ctarank;")


@gluon.constexpr_function
def multicast_rows_ptx(kernel: str, param: int, half_rows: int, half_bytes: int, threads: int) -> str:
    """One thread of each `threads` (the issuing warp or warpgroup) loads this CTA's half of a tile (rows rank * half_rows on) into both CTAs,
    at `global_smem + $1 + rank * half_bytes`, signalling the barrier at `global_smem + $2` in both. $3: the tile's
    first row, $4: its first column (TMA coordinates run innermost first). The tensor map is the kernel's
    parameter `param`, whose box is the half tile."""
    return f"""{{
.reg .b32 %mc<6>;
.reg .b16 %mcmask;
.reg .b64 %mcmap;
.reg .pred %mcp;
{_one_thread_ptx(threads, "%mcp", "%mc0")}
mov.u32 %mc1, %cluster_ctarank;
mov.u32 %mc2, global_smem;
mad.lo.u32 %mc3, %mc1, {half_bytes}, $1;
add.u32 %mc3, %mc3, %mc2;
add.u32 %mc4, %mc2, $2;
mad.lo.u32 %mc5, %mc1, {half_rows}, $3;
mov.u64 %mcmap, {kernel}_param_{param};
cvta.param.u64 %mcmap, %mcmap;
mov.b16 %mcmask, 3;
@%mcp cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%mc3], [%mcmap, {{$4, %mc5}}], [%mc4], %mcmask;
mov.u32 $0, 0;
}}"""


@gluon.jit
def asm(code: gl.constexpr, constraints: gl.constexpr, args):
    return gl.inline_asm_elementwise(code, constraints, args, dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def cluster_start():
    """After the barriers are initialised, before any CTA signals or loads into its peer."""
    asm(_CLUSTER_START_PTX, "=r,r", [0])  # $1: unused (an asm needs an operand)


@gluon.jit
def cluster_end():
    """Before exit, so that no CTA leaves while its peer may still arrive on its barriers or load into it."""
    asm(_CLUSTER_END_PTX, "=r,r", [0])


@gluon.jit
def arrive_peer(offset, THREADS: gl.constexpr):
    """Arrive on the peer CTA's mbarrier at `offset` from global_smem, once per THREADS threads (a warp or warpgroup)."""
    code: gl.constexpr = arrive_peer_ptx(THREADS)
    asm(code, "=r,r", [offset])


@gluon.jit
def cta_rank():
    return gl.inline_asm_elementwise(_CTA_RANK_PTX, "=r,r", [0], dtype=gl.int32, is_pure=True, pack=1)


@gluon.constexpr_function
def cta_copies(rank: int, ctas: int) -> list[list[int]]:
    """The cga_layout of a tensor every CTA of a `ctas`-CTA cluster holds whole (a broadcast basis; none for one
    CTA): the GEMM's CTAs each compute a tile of their own, so no layout splits a tensor between them."""
    return [[0] * rank] if ctas == 2 else []


def allocation_offsets(kernel, names: tuple[str, ...], options: dict) -> dict[str, int]:
    """The offsets from `global_smem` that Triton's shared-memory allocator gives the kernel's buffers named
    `names` (their variable names in the kernel): its TTGIR through the passes make_llir runs up to and
    including the allocation."""
    from triton._C.libtriton import ir, nvidia, passes
    from triton.backends.nvidia.compiler import get_ptx_version_from_options
    from triton.compiler.compiler import make_backend

    backend = make_backend(HOPPER)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.ttgir"
        path.write_text(_with_ranks(kernel.asm["ttgir"]))
        module = ir.parse_mlir_module(str(path), context)
    manager = ir.pass_manager(context)
    passes.ttgpuir.add_combine_tensor_select_and_if(manager)
    passes.ttgpuir.add_allocate_warp_groups(manager)
    passes.convert.add_scf_to_cf(manager)
    passes.gluon.add_inliner(manager)
    ptx_version = get_ptx_version_from_options(backend.parse_options(options), HOPPER.arch)
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(manager, HOPPER.arch, ptx_version)
    manager.run(module, "allocation_offsets")
    found = dict(re.findall(r"%(\w+) = ttg\.local_alloc \{allocation\.offset = (\d+) : i32\}", str(module)))
    missing = [name for name in names if name not in found]
    if missing:
        raise RuntimeError(f"allocation offsets of {missing} not found in the allocated TTGIR")
    return {name: int(found[name]) for name in names}


def compile_at_offsets(compile_with, names: tuple[str, ...], options: dict):
    """(kernel, offsets) from `compile_with(offsets)`, where `offsets` gives each buffer in `names` its offset from
    `global_smem` for the inline PTX: compiled once with zeros to learn where Triton's allocator puts the buffers,
    then with those offsets, which must not move them (else RuntimeError: the PTX would address the wrong ones)."""
    kernel = compile_with(dict.fromkeys(names, 0))
    offsets = allocation_offsets(kernel, names, options)
    kernel = compile_with(offsets)
    moved = allocation_offsets(kernel, names, options)
    if moved != offsets:
        raise RuntimeError(f"the buffers moved when their offsets went into the PTX: {offsets} -> {moved}")
    return kernel, offsets


def _with_ranks(ttgir: str) -> str:
    """The TTGIR with `rank = 1` in each 1-D NVMMA shared layout with CTA bases: Triton 3.6 prints such a layout
    without its rank, and its parser takes a layout without one for 2-D ("'CGALayout' entry length does not match
    rank 2"), but accepts the rank written out."""
    return re.sub(r"(#ttg\.nvmma_shared<\{)([^}]*CGALayout = \[\[\d+\](?:, \[\d+\])*\])", r"\1rank = 1, \2", ttgir)


def barrier_inits(kernel) -> dict[int, list[int]]:
    """Offsets from `global_smem` of the barriers Triton's own `mbarrier.init` lowering initialises, by arrival
    count, read from the LLVM IR: an independent check of the offsets inline PTX uses."""
    found: dict[int, list[int]] = {}
    pattern = r"mbarrier\.init\.shared::cta\.b64 \[\$1\], (\d+);.*?@global_smem, i32 (\d+)\)"
    for count, offset in re.findall(pattern, kernel.asm["llir"]):
        found.setdefault(int(count), []).append(int(offset))
    return {count: sorted(offsets) for count, offsets in found.items()}
