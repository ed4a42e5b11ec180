"""Scheduling hints set in a compiled kernel's SASS: the blockwise promotion's FFMAs made to yield, as DeepGEMM's
FFMA interleaving does (its README: the yield bit lets the warp scheduler switch warps after the instruction, so
other warpgroups' wgmma issue between one warpgroup's FP32 adds; 10%+ on some fine-grained-scaling shapes).

Every Volta-and-later SASS instruction is 128 bits; its control bits hold, among others, a yield hint (bit 109,
clear: the scheduler may switch warps after it) and operand-reuse flags (bits 122-125: keep a source operand in
the reuse cache for the next instruction, which a warp switch would invalidate). ptxas leaves a promotion FFMA
(`FFMA Racc, Rproduct, Rscale.reuse, Racc`) unyielding with the shared scale's reuse flag set; here both are
cleared. Hints only: what an instruction computes is untouched (the patch checks that every other bit of the cubin
is as ptxas wrote it), so the kernel's results are bit for bit the same.

The instructions are found by disassembling the cubin with Triton's cuobjdump and patched at their offset in the
kernel's `.text` section of the ELF file.
"""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from pathlib import Path

# In the instruction's high 64 bits: the second source operand's reuse flag (bit 123) and the no-yield bit (109).
REUSE_AND_NO_YIELD = (1 << (123 - 64)) | (1 << (109 - 64))
# A promotion FFMA: the accumulator is the destination and the addend, the scale (second source) reused.
_PROMOTION_FFMA = re.compile(r"^FFMA (R\d+), R\d+, R\d+\.reuse, \1$")
# cuobjdump -sass: `/*0a30*/  FFMA R1, R2, R3, R1 ;  /* 0x...low... */` then a line `/* 0x...high... */`.
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.+?)\s*;\s*/\* (0x[0-9a-f]{16}) \*/")
_HIGH_WORD = re.compile(r"^\s*/\* (0x[0-9a-f]{16}) \*/\s*$")


def disassemble(cubin: bytes) -> list[tuple[int, str, int, int]]:
    """(offset in .text, instruction text, low and high 64-bit words) of every instruction of a one-kernel cubin."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        lines = subprocess.run([knobs.nvidia.cuobjdump.path, "-sass", str(path)], capture_output=True, text=True,
                               check=True).stdout.splitlines()
    instructions = []
    for line, following in zip(lines, lines[1:]):
        found, high = _INSTRUCTION.search(line), _HIGH_WORD.match(following)
        if found and high:
            instructions.append((int(found.group(1), 16), found.group(2).strip(), int(found.group(3), 16),
                                 int(high.group(1), 16)))
    return instructions


def text_section_offset(cubin: bytes, kernel_name: str) -> int:
    """Where the kernel's code (`.text.<kernel_name>`) starts in the ELF64 file."""
    (section_headers,) = struct.unpack_from("<Q", cubin, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", cubin, section_headers + i * entry_size) for i in range(count)]
    names = headers[names_index][4]
    wanted = f".text.{kernel_name}".encode()
    for name, _, _, _, offset, _ in headers:
        if cubin[names + name:cubin.index(b"\0", names + name)] == wanted:
            return offset
    raise ValueError(f"the cubin has no section .text.{kernel_name}")


def yield_after_promotions(cubin: bytes, kernel_name: str) -> tuple[bytes, int]:
    """The cubin with every promotion FFMA yielding (and not reusing its scale operand), and how many were changed."""
    text = text_section_offset(cubin, kernel_name)
    patched = bytearray(cubin)
    changed = 0
    for offset, instruction, low, high in disassemble(cubin):
        if not _PROMOTION_FFMA.match(instruction) or high & REUSE_AND_NO_YIELD != REUSE_AND_NO_YIELD:
            continue
        start = text + offset
        if struct.unpack_from("<QQ", patched, start) != (low, high):
            raise ValueError(f"{instruction} at .text+{offset:#x}: the cubin's bytes differ from the disassembly")
        struct.pack_into("<Q", patched, start + 8, high ^ REUSE_AND_NO_YIELD)
        changed += 1
    return bytes(patched), changed
