"""Where an FP8 GEMM's time goes, ours against cuBLAS, from Nsight Compute (ncu) hardware counters: one product,
one regime, one kernel launch of each profiled with ncu's full set.

    python tools/gemm_profile.py run --shape 4096x16384x7168 --regime blockwise/fast_accum=off --out DIR [--own-clock]
    python tools/gemm_profile.py summarize DIR        # the tables again, from DIR's exported counters (or gzipped)
    python tools/gemm_profile.py summarize BEFORE AFTER   # two runs' kernels side by side (compare in SM cycles)

`run` launches this script's `launch` command under ncu once per backend (`ours`: fp8kernels.gemm.fp8_gemm with the
heuristic's config, or the fields FP8KERNELS_GEMM_CONFIG forces onto it; `cublas`: torch._scaled_mm as `fp8bench
matmul` calls it), profiles its third kernel launch, and exports each report's counters (DIR/<backend>.raw.csv) and
its SASS with per-instruction stall samples (DIR/<backend>.sass.csv). Then, side by side: the kernel's duration, SM
clock and SM cycles (ncu locks the clock near base while it profiles, a little differently from run to run: durations
compare between the backends of a run and cycles across runs, neither with a timed run, whose clock the power cap
sets; `--own-clock` leaves the clock to the GPU, as in a timed run), how busy the tensor pipe, L2, DRAM and shared
memory were, the bytes the SMs received against those L2 read to serve them (and how many SMs each sector reached),
issue activity, the leading stall reasons, and each kernel's hot instruction runs (consecutive instructions executed
equally often, i.e. loop bodies) with their share of the stall samples. Needs an sm_90 GPU and ncu (`--ncu`, default:
on PATH or /usr/local/cuda/bin/ncu).
"""

from __future__ import annotations

import csv
import gzip
import itertools
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

# gemm_sweep, a sibling script (not a package), is imported where needed: it loads torch, which `summarize` does not need.
sys.path.insert(0, str(Path(__file__).parent))
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)
console = Console(width=200)
BACKENDS = ("ours", "cublas")
# ncu's kernel filter per backend (regex on the function name): ours is the Gluon or the Triton kernel; cuBLAS's
# FP8 GEMMs on Hopper are nvjet or CUTLASS sm90 kernels. The quantization of the operands comes before and matches neither.
KERNEL_FILTERS = {"ours": "_fp8_gemm", "cublas": "nvjet|sm90_xmma|cutlass"}
CALLS = 3  # the profiled launch is the last: the first compiles (ours) or picks an algorithm (cuBLAS)
# (column, counter, unit) of the side-by-side table.
COUNTERS = (
    ("duration_us", "gpu__time_duration.sum", "us"),
    ("sm_clock_ghz", "sm__cycles_elapsed.avg.per_second", "GHz"),
    ("sm_kilocycles", None, "k"),  # duration x clock (read_counters)
    ("tensor_pipe_pct", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed", "%"),
    ("l2_pct", "lts__throughput.avg.pct_of_peak_sustained_elapsed", "%"),
    ("dram_pct", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "%"),
    # What the SMs received from L2 over the crossbar, against what L2 read to serve it and what crossed between L2's
    # two partitions; and the fan-out between them: the SMs each sector from L2 reached, through the L2 request
    # coalescer (LRC: identical reads that meet in it served once) and TMA multicast. At M 1024, K 16384, N 1024 every
    # kernel received 402.7 MB, L2 read 281 MB for our pick and 169 MB for cuBLAS's: fan-out 1.46 against 2.24
    # (reports/h200/gemm-two-sums).
    ("sm_received_mb", "l1tex__m_xbar2l1tex_read_bytes.sum", "MB"),
    ("l2_read_mb", "lts__t_sectors_srcunit_tex_op_read.sum", "MB"),
    ("l2_fabric_mb", "lts__t_sectors_srcunit_ltcfabric.sum", "MB"),
    ("l2_sector_fanout", "lrc__average_xbar2gpc_sectors_op_read.ratio", ""),
    ("shared_wavefronts_pct", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed", "%"),
    ("issue_active_pct", "smsp__issue_active.avg.pct_of_peak_sustained_active", "%"),
    ("grid", "launch__grid_size", ""),
    ("cluster", "launch__cluster_size", ""),
    ("block", "launch__block_size", ""),
    ("registers", "launch__registers_per_thread", ""),
    ("shared_kb", "launch__shared_mem_per_block_dynamic", "KB"),
)
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
SAMPLES = "Warp Stall Sampling (All Samples)"
HOT_SHARE = 0.02  # instruction runs with at least this share of a kernel's stall samples are listed


class ProfileError(Exception):
    """A file of the profile folder that is missing or not what ncu exports: exit 2 naming it."""


@dataclass(frozen=True)
class KernelCounters:
    """One profiled kernel: its name, the table's counters and its stall reasons (warps per issued instruction)."""
    kernel: str
    values: dict[str, float]
    stalls: dict[str, float]


@dataclass(frozen=True)
class HotRun:
    """Consecutive SASS instructions executed equally often (a loop body or straight-line block) and their samples."""
    first: str  # offset of its first instruction from the kernel's first
    instructions: int
    executed: int  # times each of its instructions ran (all warps)
    share: float  # of the kernel's stall samples
    stalls: dict[str, float]  # the leading stall reasons, share of the run's samples
    qgmma: int
    ffma: int
    barriers: int  # BAR.SYNC and WARPGROUP.DEPBAR: where a warp waits for others or for its MMA


def _number(text: str) -> float:
    return float(text.replace(",", "")) if text.strip() not in ("", "n/a") else float("nan")


# ncu picks each value's unit by its size (a kernel of 1.7 ms has its duration in ms): the factors to the table's.
UNIT_SCALES = {
    "us": {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6},
    "GHz": {"hz": 1e-9, "Khz": 1e-6, "Mhz": 1e-3, "Ghz": 1.0},
    "KB": {"byte/block": 1e-3, "Kbyte/block": 1.0, "Mbyte/block": 1e3},
    "MB": {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "sector": 32e-6},  # L2's sectors are 32 bytes
}


def _unit_scale(path: Path, counter: str, given: str, unit: str) -> float:
    """The factor from the unit ncu gave a counter to the table's `unit` (1 for the units it does not scale)."""
    scales = UNIT_SCALES.get(unit)
    if scales is None:
        return 1.0
    if given not in scales:
        raise ProfileError(f"{path}: {counter} in {given!r}, not one of {', '.join(scales)}")
    return scales[given]


def exported(folder: Path, name: str) -> Path | None:
    """An export of the folder, as `run` wrote it (NAME) or compressed for keeping (NAME.gz); None if neither is there."""
    return next((path for path in (folder / name, folder / f"{name}.gz") if path.is_file()), None)


def _rows(path: Path) -> list[list[str]]:
    try:
        with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as f:
            return list(csv.reader(f))
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as err:
        raise ProfileError(f"{path}: cannot read ({getattr(err, 'strerror', None) or err})") from None


def read_counters(path: Path) -> KernelCounters:
    """The counters of `ncu --import REPORT --page raw --csv` (a header row, a units row, one row per kernel: the first)."""
    rows = _rows(path)
    if len(rows) < 3 or "Kernel Name" not in rows[0]:
        raise ProfileError(f"{path}: not ncu's raw counters (a header with 'Kernel Name', units, a kernel's row)")
    row = dict(zip(rows[0], rows[2]))
    units = dict(zip(rows[0], rows[1]))
    values = {column: _number(row[counter]) * _unit_scale(path, counter, units[counter], unit)
              for column, counter, unit in COUNTERS if counter in row}
    if {"duration_us", "sm_clock_ghz"} <= values.keys():
        # ncu's locked clock differs a little from run to run (1.38-1.44 GHz on an H100): cycles compare across runs.
        values["sm_kilocycles"] = values["duration_us"] * values["sm_clock_ghz"]
    stalls = {name[len(STALL_PREFIX):-len(STALL_SUFFIX)]: _number(value) for name, value in row.items()
              if name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX)}
    return KernelCounters(row["Kernel Name"], values, stalls)


def read_hot_runs(path: Path, share: float = HOT_SHARE) -> list[HotRun]:
    """The runs of `ncu --page source --csv --print-source sass` holding at least `share` of its stall samples."""
    rows = _rows(path)
    header = next((i for i, row in enumerate(rows) if "Address" in row and SAMPLES in row), None)
    if header is None:
        raise ProfileError(f"{path}: not ncu's SASS source page (no 'Address' and '{SAMPLES}' columns)")
    names = rows[header]
    column = {name: i for i, name in enumerate(names)}
    stall_columns = [n for n in names if n.startswith("stall_") and "Not Issued" not in n]
    body = [row for row in rows[header + 1:] if len(row) == len(names)]
    total = sum(_number(row[column[SAMPLES]]) for row in body) or 1.0
    start = int(body[0][column["Address"]], 16) if body else 0
    runs = []
    for executed, rows_of_run in itertools.groupby(body, key=lambda row: row[column["Instructions Executed"]]):
        group = list(rows_of_run)
        samples = sum(_number(row[column[SAMPLES]]) for row in group)
        if samples < share * total:
            continue
        reasons = {n[len("stall_"):]: sum(_number(row[column[n]]) for row in group) for n in stall_columns}
        leading = dict(sorted(((k, v / samples) for k, v in reasons.items() if v), key=lambda kv: -kv[1])[:4])
        source = [row[column["Source"]] for row in group]
        runs.append(HotRun(f"+{int(group[0][column['Address']], 16) - start:#x}", len(group), int(_number(executed)),
                           samples / total, leading, sum("QGMMA" in s for s in source), sum("FFMA" in s for s in source),
                           sum("BAR.SYNC" in s or "WARPGROUP.DEPBAR" in s for s in source)))
    return runs


def _exit_2(message: str) -> None:
    console.print(f"gemm_profile: {message}", highlight=False)
    raise typer.Exit(2)


def _product(shape: str, regime: str):
    """(GemmShape, granularity, fast_accum) of --shape and --regime, or exit 2 naming the bad one."""
    from fp8bench.benchmarks.shapes import parse_product

    from gemm_sweep import parse_regime

    try:
        product = parse_product(shape)
    except ValueError as err:
        _exit_2(str(err))
    try:
        granularity, fast_accum = parse_regime(regime)
    except typer.BadParameter as err:
        _exit_2(str(err))
    return product, granularity, fast_accum


@app.command(hidden=True)
def launch(backend: str = typer.Option(...), shape: str = typer.Option(...), regime: str = typer.Option(...)):
    """The product CALLS times on `backend` (what `run` profiles under ncu)."""
    import torch

    product, granularity, fast_accum = _product(shape, regime)
    if not torch.cuda.is_available():
        _exit_2("needs a CUDA GPU")
    from fp8bench.backends import REGISTRY
    from fp8bench.backends.triton import kernel_operands
    from fp8bench.benchmarks.matmul import random_operands
    from fp8kernels.gemm import fp8_gemm
    from gemm_sweep import _fast

    operands = random_operands(product)
    if backend == "ours":
        quantized = kernel_operands(operands, granularity)
        call = lambda: fp8_gemm(*quantized, granularity=granularity, fast_accum=fast_accum)  # noqa: E731
    elif backend == "cublas":
        fast = _fast(fast_accum)
        reason = REGISTRY["cublas"].unsupported_reason(product, granularity, fast)
        if reason:
            _exit_2(f"cublas: unsupported: {reason}")
        call = REGISTRY["cublas"].prepare_gemm(operands, granularity, fast).run
    else:
        _exit_2(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    for _ in range(CALLS):
        call()
    torch.cuda.synchronize()


def _ncu_path(given: str | None) -> str | None:
    if given:
        return given if Path(given).is_file() else None
    return shutil.which("ncu") or next((p for p in ("/usr/local/cuda/bin/ncu",) if Path(p).is_file()), None)


@app.command()
def run(shape: str = typer.Option(..., help="the product, MxKxN"),
        regime: str = typer.Option(..., help="e.g. blockwise/fast_accum=off"),
        out: Path = typer.Option(..., help="folder for the reports, their exported counters and metadata.json"),
        ncu: str = typer.Option(None, help="the ncu executable (default: on PATH or /usr/local/cuda/bin/ncu)"),
        own_clock: bool = typer.Option(False, "--own-clock", help="leave the GPU's clock to it (ncu --clock-control "
                                                                  "none), as in a timed run, instead of ncu's lock "
                                                                  "near base: a kernel bound by its loads at full "
                                                                  "clock may be bound by its MMAs at base")):
    """Profile one launch of ours and of cuBLAS on the product with ncu, export the counters, print the tables."""
    import torch

    _product(shape, regime)  # a bad shape or regime exits before any profiling
    if not torch.cuda.is_available():
        _exit_2("needs a CUDA GPU")
    executable = _ncu_path(ncu)
    if executable is None:
        _exit_2(f"Nsight Compute's ncu not found ({ncu or 'not on PATH nor /usr/local/cuda/bin/ncu'}); pass --ncu")
    from fp8bench.harness.env import run_metadata, script_command_line
    from fp8bench.harness.results import write_metadata

    out.mkdir(parents=True, exist_ok=True)
    clock_control = "none" if own_clock else "base"
    version = subprocess.run([executable, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1:]
    write_metadata(out, run_metadata(script_command_line(), {"ncu": version[0] if version else "", "shape": shape,
                                                              "regime": regime,
                                                              "ncu_clock_control": clock_control}))
    for backend in BACKENDS:
        report = out / backend
        profiled = subprocess.run(
            [executable, "--set", "full", "--clock-control", clock_control, "--launch-skip", str(CALLS - 1),
             "--launch-count", "1", "-k", f"regex:{KERNEL_FILTERS[backend]}", "-f", "-o", str(report),
             sys.executable, __file__, "launch", "--backend", backend, "--shape", shape, "--regime", regime],
            capture_output=True, text=True)
        (out / f"{backend}.ncu.log").write_text(profiled.stdout + profiled.stderr)
        if profiled.returncode or not report.with_suffix(".ncu-rep").is_file():
            console.print(f"{backend}: failed: ncu exited {profiled.returncode} without a report "
                          f"(see {out / f'{backend}.ncu.log'})", highlight=False)
            continue
        for page, name in ((["--page", "raw"], "raw"), (["--page", "source", "--print-source", "sass"], "sass")):
            exported = subprocess.run([executable, "--import", str(report.with_suffix(".ncu-rep")), *page, "--csv"],
                                      capture_output=True, text=True)
            (out / f"{backend}.{name}.csv").write_text(exported.stdout)
    print_profiles([out])


@app.command()
def summarize(folders: list[Path] = typer.Argument(..., help="folders `run` wrote: one, or several to compare (e.g. "
                                                             "before and after a change)")):
    """The counters of every profiled kernel side by side (each folder's ours and cuBLAS), then each kernel's hot
    instruction runs, from the exported CSVs."""
    print_profiles(folders)


def print_profiles(folders: list[Path]) -> None:
    """summarize's tables (and `run`'s, of its one folder); exit 2 on a folder without exports or a malformed one."""
    profiled: dict[str, KernelCounters] = {}
    hot: dict[str, list[HotRun]] = {}
    for folder in folders:
        try:
            found = {b: read_counters(path) for b in BACKENDS if (path := exported(folder, f"{b}.raw.csv"))}
            for backend in found:
                if path := exported(folder, f"{backend}.sass.csv"):
                    hot[_label(folder, backend, folders)] = read_hot_runs(path)
        except ProfileError as err:
            _exit_2(str(err))
        if not found:
            _exit_2(f"{folder}: no <backend>.raw.csv(.gz) to summarize (run `gemm_profile.py run` first)")
        profiled |= {_label(folder, backend, folders): counters for backend, counters in found.items()}
    title = folders[0] if len(folders) == 1 else f"{len(folders)} profiles"
    table = Table(title=f"{title}: one kernel launch each, counters of Nsight Compute")
    table.add_column("counter")
    for label, counters in profiled.items():
        table.add_column(f"{label}\n{counters.kernel[:60]}", justify="right")
    for column, _, unit in COUNTERS:
        table.add_row(f"{column} ({unit})" if unit else column,
                      *(f"{c.values.get(column, float('nan')):.4g}" for c in profiled.values()))
    reasons = sorted({r for c in profiled.values() for r in c.stalls},
                     key=lambda r: -max(c.stalls.get(r, 0.0) for c in profiled.values()))
    for reason in reasons[:8]:
        table.add_row(f"stall {reason} (warps per issue)", *(f"{c.stalls.get(reason, 0.0):.3g}" for c in profiled.values()))
    console.print(table)
    for label, runs in hot.items():
        listing = Table(title=f"{label}: instruction runs with {HOT_SHARE:.0%} or more of the stall samples")
        for name in ("first", "instructions", "executed", "samples", "QGMMA", "FFMA", "barriers", "leading stalls"):
            listing.add_column(name, justify="left" if name in ("first", "leading stalls") else "right")
        for r in runs:
            listing.add_row(r.first, str(r.instructions), str(r.executed), f"{r.share:.1%}", str(r.qgmma), str(r.ffma),
                            str(r.barriers), ", ".join(f"{k} {v:.0%}" for k, v in r.stalls.items()))
        console.print(listing)


def _label(folder: Path, backend: str, folders: list[Path]) -> str:
    """A kernel's column: its backend, and where several folders are compared its folder's name (with its parent's,
    or its path as given, where two folders share a name)."""
    if len(folders) == 1:
        return backend
    for name in (folder.name, f"{folder.parent.name}/{folder.name}"):
        if [f"{f.parent.name}/{f.name}" if "/" in name else f.name for f in folders].count(name) == 1:
            return f"{name}: {backend}"
    return f"{folder}: {backend}"


if __name__ == "__main__":
    app()
