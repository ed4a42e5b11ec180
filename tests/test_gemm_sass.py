"""tools/gemm_sass.py: reading ptxas's verdict on the Gluon GEMM (always), and every Gluon candidate assembled for
sm_90a without spills or serialized wgmmas (where Triton is the release the kernel is written against: the GPU
host's; no GPU needed)."""

from __future__ import annotations

import os

import pytest
import torch
import triton

from fp8kernels.gemm import GLUON_TRITON_RELEASES

from tool_module import load_tool

sass_tool = load_tool("gemm_sass", triton_kernels=True)
# The compiling tests run where Triton is the release the Gluon kernel is written against (the GPU host's), outside the
# interpreter, which a test run without a GPU sets.
_OTHER_RELEASE = not triton.__version__.startswith(GLUON_TRITON_RELEASES)
gluon_compiles = pytest.mark.skipif(
    _OTHER_RELEASE or os.environ.get("TRITON_INTERPRET") == "1",
    reason=f"the Gluon kernel is written against Triton {GLUON_TRITON_RELEASES}, this is {triton.__version__}"
    if _OTHER_RELEASE else "Gluon kernels are not compiled under TRITON_INTERPRET, which a test run without a GPU sets")

# ptxas -v of the overlapped blockwise tile before its promotion was pinned (reports/h100-sxm/gemm-overlapped-promotion).
SPILLED_AND_SERIALIZED = """ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions defining accumulator registers of a wgmma between start and end of the pipeline stage in the function '_fp8_gemm_ws_kernel'
ptxas info    : Compiling entry function '_fp8_gemm_ws_kernel' for 'sm_90a'
    152 bytes stack frame, 1084 bytes spill stores, 828 bytes spill loads
ptxas info    : Used 168 registers, used 3 barriers, 152 bytes cumulative stack size
"""
READ_IN_FLIGHT = ("ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due "
                  "to non wgmma instructions reading accumulator registers of  a wgmma between start and end of the "
                  "pipeline stage in the function '_fp8_gemm_ws_kernel'\n")
CLEAN = """ptxas info    : Compiling entry function '_fp8_gemm_ws_kernel' for 'sm_90a'
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, used 4 barriers
"""
SASS = """
        /*0a10*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR16], R24, gsb0 ;
        /*0a20*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0b10*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R88, gdesc[UR16], R88, gsb0 ;
        /*0b20*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
"""


def test_a_report_reads_spills_serialization_and_waits_in_flight():
    bad = sass_tool.read_report("blockwise/fast_accum=off", "128x128x128 s4", SPILLED_AND_SERIALIZED, SASS)
    assert (bad.registers, bad.spilled_bytes, bad.serialized, bad.wgmmas, bad.waits_in_flight) == (168, 1912, True, 2, 1)
    assert not bad.clean
    # ptxas's other serializing note: a composite tile's products carried in flight round its K loop were read so.
    read = CLEAN.replace("ptxas info    : Compiling", READ_IN_FLIGHT + "ptxas info    : Compiling")
    assert sass_tool.read_report("tensorwise/fast_accum=off", "128x192x128 s4", read, "").serialized
    good = sass_tool.read_report("blockwise/fast_accum=off", "192x128x128 s3", CLEAN, "")
    assert good.clean and (good.registers, good.spilled_bytes, good.wgmmas) == (128, 0, 0)


@gluon_compiles
def test_every_gluon_candidate_assembles_without_spills_or_serialized_wgmmas():
    reports = [sass_tool.compile_report(c, g, f, rows) for g, f, rows, c in sass_tool.gluon_candidates(sass_tool.REGIMES)]
    assert len(reports) > 20
    assert [r for r in reports if not r.clean] == []
    assert any(r.regime == "blockwise-1x128/fast_accum=off" for r in reports)
    overlapped = [r for r in reports if "overlapped" in r.config]
    assert overlapped and all(r.waits_in_flight > 0 for r in overlapped)


@gluon_compiles
@pytest.mark.parametrize("regime, block_m, block_n", [("blockwise/fast_accum=off", 192, 128),
                                                      ("tensorwise/fast_accum=on", 128, 256),
                                                      ("axiswise/fast_accum=off", 128, 256)])
def test_a_cluster_of_two_ctas_multicasts_b_into_the_buffers_triton_allocated(regime, block_m, block_n):
    """cluster_m 2 compiles as a 2-CTA cluster whose B comes by one multicast load a CTA, each CTA holding its own copy of
    every tile in the swizzle one CTA's tile takes (compile_sm90 checks the inline PTX's offsets against Triton's); the
    256-wide tile too, its B in two 128-row boxes a slot."""
    import dataclasses
    import re

    from triton.tools.disasm import get_sass

    from fp8kernels._gemm_ws import compile_sm90, shared_layout
    from fp8kernels.gemm_configs import gluon_tiles

    granularity, fast_accum = sass_tool.parse_regime(regime)
    tile = next(t for t, _ in gluon_tiles(granularity, fast_accum) if (t.block_m, t.block_n) == (block_m, block_n))
    kernel = compile_sm90(dataclasses.replace(tile.with_sms(132), split_last_wave=False, cluster_m=2),
                          granularity, fast_accum)
    assert re.search(r"\.reqnctapercluster 2\b", kernel.asm["ptx"])
    sass = get_sass(kernel.asm["cubin"])
    assert sass.count("UTMALDG.2D.MULTICAST") == 1 and "UCGABAR_WAIT" in sass
    # The producer issues each TMA load once, not in a loop over lanes (the multicast and the peer's arrives elect
    # their thread: kernels/_cluster.py), and each consumer warp arrives on the peer's barrier.
    assert "BRA.U.ANY" not in sass
    assert sass.count("SYNCS.ARRIVE.TRANS64.RED") == block_m // 64  # one remote arrive in each consumer warpgroup's loop
    # One cluster barrier in each partition (the consumers, the producer, the warps beside it), at its start, with a
    # relaxed arrive: no GPU-scope fence anywhere (kernels/_cluster.py).
    partitions = block_m // 64 + 3
    assert sass.count("UCGABAR_ARV") == sass.count("UCGABAR_WAIT") == partitions
    assert sass.count("MEMBAR.ALL.GPU") == 0
    assert shared_layout([64, 128], "float8_e4m3fn", 2).swizzle_byte_width == 128
    assert shared_layout([64, 128], "float8_e4m3fn", 2).cga_layout == [[0, 0]]


@gluon_compiles
@pytest.mark.parametrize("regime", ["tensorwise/fast_accum=on", "axiswise/fast_accum=off", "blockwise/fast_accum=off"])
def test_a_cluster_along_n_multicasts_a_and_loads_b_alone(regime):
    """cluster_n 2 compiles as a 2-CTA cluster whose A comes by one multicast load a CTA (one consumer's rows) and whose
    B comes by a load of its own, with each consumer warpgroup arriving on the peer's barrier."""
    import dataclasses
    import re

    from triton.tools.disasm import get_sass

    from fp8kernels._gemm_ws import compile_sm90
    from fp8kernels.gemm_configs import SLIM_GLUON

    granularity, fast_accum = sass_tool.parse_regime(regime)
    config = dataclasses.replace(SLIM_GLUON.with_sms(132), num_stages=8, split_last_wave=False, cluster_n=2)
    kernel = compile_sm90(config, granularity, fast_accum)
    assert re.search(r"\.reqnctapercluster 2\b", kernel.asm["ptx"])
    sass = get_sass(kernel.asm["cubin"])
    assert sass.count("UTMALDG.2D.MULTICAST") == 1 and "BRA.U.ANY" not in sass
    assert len(re.findall(r"UTMALDG\.2D(?!\.MULTICAST)", sass)) >= 1  # B (and blockwise the scales) alone
    assert sass.count("SYNCS.ARRIVE.TRANS64.RED") == 2


@gluon_compiles
def test_a_tile_wider_than_a_power_of_two_compiles_as_parts_in_buffers_of_their_own():
    """tools/gluon_composite_probe.py: 192 rows of B in one shared buffer stop at the layout's power-of-two assertion;
    128 + 64 and 128 + 32 rows, each part in its own buffer, compile to a wgmma of each width per 32 of K."""
    probe = load_tool("gluon_composite_probe")
    assert "shape must be a postive power of 2" in probe.form_report("one-buffer-192")
    assert probe.form_report("parts-128-64") == "parts-128-64: compiles; wgmmas {'n128': 4, 'n64': 4, 'n32': 0}; TMA loads 4"
    assert probe.form_report("parts-128-32") == "parts-128-32: compiles; wgmmas {'n128': 4, 'n64': 0, 'n32': 4}; TMA loads 6"


@gluon_compiles
def test_a_composite_tile_runs_its_right_part_as_a_wgmma_and_a_store_of_its_own():
    """The composite 192 x 192 tile compiles to an m64n128k32 and an m64n64k32 wgmma per 32 of K (its two parts, each
    into its own accumulator) and stores each part through a TMA box of its width."""
    import re

    from fp8kernels._gemm_ws import compile_sm90
    from fp8kernels.gemm_configs import COMPOSITE_TALL_GLUON
    from fp8kernels.scaling import Granularity

    ptx = compile_sm90(COMPOSITE_TALL_GLUON.with_sms(132), Granularity.TENSORWISE, True).asm["ptx"]
    shapes = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k32)", ptx)
    assert sorted(set(shapes)) == ["m64n128k32", "m64n64k32"] and shapes.count("m64n128k32") == shapes.count("m64n64k32")
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", ptx)) >= 2  # a store per part


@gluon_compiles
def test_a_promoted_composite_tile_adds_its_left_part_while_its_right_part_runs():
    """Promoted, the composite 128 x 192 tile waits for its left part's wgmmas alone (one group left in flight, the
    right part's), adds their product into the sum, then waits for the right part: the left part's 64 adds a thread lie
    between the two waits."""
    import re

    from triton.tools.disasm import get_sass

    from fp8kernels._gemm_ws import compile_sm90
    from fp8kernels.gemm_configs import COMPOSITE_WIDE_GLUON
    from fp8kernels.scaling import Granularity

    sass = get_sass(compile_sm90(COMPOSITE_WIDE_GLUON.with_sms(132), Granularity.TENSORWISE, False).asm["cubin"])
    between = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1\s*;(.*?)WARPGROUP\.DEPBAR\.LE gsb0, 0x0\s*;", sass, re.S)
    assert between and all(len(re.findall(r"\bFADD\b", code)) >= 64 for code in between)


@gluon_compiles
def test_the_axiswise_epilogue_reads_its_scales_from_shared_memory(tmp_path):
    """Axiswise, the producer TMA-loads each tile's output scales (a 1-D box of each consumer's 64 rows and of each
    128-column half), and no partition loads from global memory (the split tiles' flags compiled out)."""
    import dataclasses

    from fp8bench.config import Granularity
    from fp8kernels.gemm_configs import WIDE_GLUON

    whole = dataclasses.replace(WIDE_GLUON.with_sms(132), split_last_wave=False)
    report = sass_tool.compile_report(whole, Granularity.AXISWISE, True, sass_dir=tmp_path,
                                      launched_on=(8192, 8192, 8192))
    (sass, ) = tmp_path.glob("*.sass")
    assert report.clean and report.global_loads == 0
    assert sass.read_text().count("UTMALDG.1D") == 2 + 2
