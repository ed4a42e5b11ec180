"""What ptxas made of the warp-specialised Gluon GEMM (kernels/_gemm_ws.py), per candidate config and regime, with no
GPU: each config is compiled for sm_90a (fp8kernels._gemm_ws.compile_sm90, Triton's own ptxas) and its PTX assembled
again with `ptxas -v` for the registers, the spilled bytes and ptxas's notes. C7514 and C7515 say it serialized the
wgmmas (each waited for before the next issues: other instructions read, or define, a wgmma's accumulator registers
while it may run), which a consumer whose promotion or sums overlap its next wgmma must
avoid. From the SASS: the QGMMA instructions and the wgmma waits that leave one group or more in flight.

    python tools/gemm_sass.py                       # every Gluon candidate of every regime (and of blockwise
                                                    # products with 1 x 128 weight scales: blockwise-1x128)
    python tools/gemm_sass.py --regime blockwise/fast_accum=off --sass-dir DIR
    python tools/gemm_sass.py --regime axiswise/fast_accum=on --product 8192x8192x8192   # as that launch specializes it

Exits 1 when a config spills or has its wgmmas serialized. Needs the Triton release the kernel is written against
(fp8kernels.gemm.GLUON_TRITON_RELEASES), which the GPU host has; any CPU will do.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from fp8bench.benchmarks.shapes import parse_product
from fp8bench.config import Granularity
from fp8kernels.gemm_configs import DeviceProperties, Fp8GemmConfig, candidate_configs, config_label
from fp8kernels.scaling import BLOCK

sys.path.insert(0, str(Path(__file__).parent))
from gemm_sweep import REGIMES, WGRAD_REGIME, _regime_name, parse_regime  # noqa: E402  (a sibling script, not a package)

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, help=__doc__.split("\n\n")[0])
console = Console(width=200)
# The candidates' grid and shared memory are an H100's (an H200's too); the SASS does not depend on the SM count.
HOPPER = DeviceProperties(multiprocessor_count=132, shared_memory_per_program=227 * 1024)
# ptxas's notes C7514 (accumulator registers read by other instructions) and C7515 (defined by them) both say this.
SERIALIZED_NOTE = "wgmma.mma_async instructions are serialized"


@dataclass(frozen=True)
class SassReport:
    regime: str
    config: str
    registers: int  # the launch's per-thread count; setmaxnreg gives the consumers more
    spilled_bytes: int  # spill stores + spill loads
    serialized: bool  # ptxas note C7514 or C7515
    wgmmas: int  # QGMMA instructions in the SASS
    waits_in_flight: int  # wgmma waits that leave at least one group running (WARPGROUP.DEPBAR.LE gsb0, 0x1 or more)
    global_loads: int  # LDG instructions in the SASS (every partition's: the tensorwise scales, the split tiles' flags)
    vector_loads: int  # of those, the ones of 8 or 16 bytes a thread

    @property
    def clean(self) -> bool:
        return not self.spilled_bytes and not self.serialized


def ptxas_verbose(ptx: str) -> str:
    """`ptxas -v` of `ptx` for sm_90a with Triton's ptxas: its info lines and notes."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        done = subprocess.run([knobs.nvidia.ptxas.path, "-v", "--gpu-name", "sm_90a", str(source), "-o",
                               str(Path(folder) / "kernel.o")], capture_output=True, text=True, check=True)
    return done.stdout + done.stderr


def read_report(regime: str, config: str, ptxas_text: str, sass: str) -> SassReport:
    """The report of one compiled config from its `ptxas -v` text and SASS."""
    registers = re.search(r"Used (\d+) registers", ptxas_text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", ptxas_text)
    waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x([0-9a-f]+)", sass)
    loads = re.findall(r"\bLDG\.(\S+)", sass)
    return SassReport(regime, config, int(registers.group(1)) if registers else 0,
                      int(spills.group(1)) + int(spills.group(2)) if spills else 0, SERIALIZED_NOTE in ptxas_text,
                      len(re.findall(r"\bQGMMA\.", sass)), sum(int(w, 16) > 0 for w in waits), len(loads),
                      sum(bool(re.search(r"\b(64|128)\b", modifiers.replace(".", " "))) for modifiers in loads))


def regime_label(granularity: Granularity, fast_accum: bool, b_rows: int) -> str:
    """gemm_sweep's regime names, its WGRAD_REGIME for 1 x 128 weight scales (blockwise, which always promotes)."""
    return WGRAD_REGIME if b_rows == 1 else _regime_name(granularity, fast_accum)


def compile_report(config: Fp8GemmConfig, granularity: Granularity, fast_accum: bool, b_rows: int = BLOCK,
                   sass_dir: Path | None = None, launched_on: tuple[int, int, int] | None = None) -> SassReport:
    """`launched_on` (M, K, N): compiled as a launch on that product specializes it (compile_sm90)."""
    from triton.tools.disasm import get_sass

    from fp8kernels._gemm_ws import compile_sm90

    kernel = compile_sm90(config, granularity, fast_accum, b_rows=b_rows, launched_on=launched_on)
    sass = get_sass(kernel.asm["cubin"])
    label = config_label(config.as_dict() | {"split_tiles": 0})
    regime = regime_label(granularity, fast_accum, b_rows)
    if sass_dir is not None:
        (sass_dir / f"{regime}-{label}.sass".replace("/", "-").replace(" ", "-")).write_text(sass)
    return read_report(regime, label, ptxas_verbose(kernel.asm["ptx"]), sass)


def regimes_with_weight_scales(regimes) -> list[tuple[Granularity, bool, int]]:
    """Each regime with its rows per weight scale: blockwise twice, with 128 x 128 blocks and 1 x 128 groups."""
    return [(g, f, rows) for g, f in regimes for rows in ((BLOCK, 1) if g is Granularity.BLOCKWISE else (BLOCK, ))]


def gluon_candidates(regimes) -> list[tuple[Granularity, bool, int, Fp8GemmConfig]]:
    return [(g, f, rows, c) for g, f, rows in regimes_with_weight_scales(regimes)
            for c in candidate_configs(g, f, HOPPER, rows) if c.gluon_ws]


@app.command()
def main(regime: list[str] = typer.Option([], help="e.g. blockwise/fast_accum=off (repeatable; default: all five)"),
         sass_dir: Path | None = typer.Option(None, help="also write each config's SASS here"),
         product: str | None = typer.Option(None, help="MxKxN: compile each config as a launch on this product "
                                                        "specializes it (arguments equal to 1 as constants, multiples "
                                                        "of 16 and aligned pointers marked so); default: every "
                                                        "argument general")) -> None:
    import triton

    from fp8kernels.gemm import GLUON_TRITON_RELEASES

    if not triton.__version__.startswith(GLUON_TRITON_RELEASES):
        console.print(f"[red]the Gluon kernel is written against Triton {', '.join(GLUON_TRITON_RELEASES)}x; "
                      f"this is {triton.__version__}[/]")
        raise typer.Exit(2)
    regimes = [parse_regime(name) for name in regime] or REGIMES  # blockwise brings blockwise-1x128 with it
    launched_on = None
    if product:
        try:
            shape = parse_product(product)
        except ValueError as err:
            raise typer.BadParameter(str(err).replace("--shape", "--product"), param_hint="--product") from None
        launched_on = (shape.M, shape.K, shape.N)
    if sass_dir is not None:
        sass_dir.mkdir(parents=True, exist_ok=True)
    reports = [compile_report(c, g, f, rows, sass_dir, launched_on)
               for g, f, rows, c in gluon_candidates(regimes)]
    table = Table(title="the Gluon GEMM for sm_90a, per candidate", title_justify="left")
    for column in ("regime", "config", "registers", "spilled bytes", "wgmmas serialized", "QGMMA", "waits leaving some in flight",
                   "LDG (vector)"):
        table.add_column(column)
    for r in reports:
        table.add_row(r.regime, r.config, str(r.registers), str(r.spilled_bytes), "yes" if r.serialized else "no",
                      str(r.wgmmas), str(r.waits_in_flight), f"{r.global_loads} ({r.vector_loads})",
                      style=None if r.clean else "red")
    console.print(table)
    raise typer.Exit(0 if all(r.clean for r in reports) else 1)


if __name__ == "__main__":
    app()
