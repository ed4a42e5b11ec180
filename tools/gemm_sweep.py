"""Our FP8 GEMM (fp8kernels.gemm) against cuBLAS (torch._scaled_mm), side by side on one GPU.

    python tools/gemm_sweep.py compare --out DIR   # the heuristic's configs on the target shapes
    python tools/gemm_sweep.py compare --out DIR --baseline-kernels /tmp/kernels-before   # a kernel change's A/B
    python tools/gemm_sweep.py compare --out DIR --shape-gen awkward [--reverse]   # a shape set, in either order
    python tools/gemm_sweep.py both-orders DIR DIR_REVERSED   # each variant against the pick over both orders (no GPU)
    python tools/gemm_sweep.py tune --out DIR      # every candidate config on a few tuning shapes
    python tools/gemm_sweep.py gluon --out DIR     # the Gluon kernel's configs against the Triton preset
    python tools/gemm_sweep.py wgrad --out DIR     # grad_weight's blockwise products (1 x 128 x 1 x 128)

Both time with fp8bench.harness.timing (TimerChoice.measure), cuBLAS and ours on the same operands, the
order (cuBLAS, ours and their variants) reversed from shape to shape, and write result-schema rows (fp8bench.harness.results) to
DIR/results.csv with the config in `options`. `compare` prints TFLOPS and our/cuBLAS ratios per shape and
their geometric means per regime; `tune` prints each candidate's geometric-mean ratio and the best config
per shape. Candidate kernels are compiled first in parallel worker processes (Triton's cache keeps them), so
the timed loop does not wait on the compiler. Each of our outputs is checked against cuBLAS's before it
counts.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import multiprocessing
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import typer
from rich.console import Console
from rich.table import Table
from scipy.stats import gmean

from fp8bench.backends import REGISTRY
from fp8bench.backends.triton import kernel_operands
from fp8bench.config import BLOCK, FastAccum, GemmShape, Granularity, MatmulCase, TimingConfig
from fp8bench.harness.env import run_metadata, script_command_line
from fp8bench.model.hardware import spec_for_device_name
from fp8bench.benchmarks.matmul import GemmCase, MatmulBenchmark, random_operands
from fp8bench.harness.results import RunWriter
from fp8bench.harness.runner import measured_row
from fp8bench.benchmarks.shapes import SHAPE_GENERATORS, llama, parse_product, square, training
from fp8bench.harness.timing import TimerChoice
from fp8kernels.gemm import device_properties, fp8_gemm, gemm_config, gluon_runs_on, launch_kernel
from fp8kernels.gemm_configs import (Fp8GemmConfig, candidate_configs, choose_config, config_label,
                                    last_wave_split, parse_config_fields)
from fp8kernels.gemm_autotune import tuning_candidates

sys.path.insert(0, str(Path(__file__).parent))
from gemm_heuristic_grade import changed, parse_setting  # noqa: E402  (a sibling script, not a package)
from kernel_tree import KernelTree  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)
console = Console(width=200)

# (granularity, fast accumulation): each regime against cuBLAS with the same settings.
REGIMES = (
    (Granularity.TENSORWISE, True),
    (Granularity.TENSORWISE, False),
    (Granularity.AXISWISE, True),
    (Granularity.AXISWISE, False),
    (Granularity.BLOCKWISE, False),
)
# Regimes with kernels of their own to tune: axiswise differs from tensorwise only in its epilogue.
TUNED_REGIMES = ((Granularity.TENSORWISE, True), (Granularity.TENSORWISE, False), (Granularity.BLOCKWISE, False))
TUNING_SHAPE_NAMES = (
    "8192x8192x8192", "4096x4096x4096", "llama3-8b.wqkv.M8192", "llama3-8b.w2.M8192",
    "llama3-70b-tp8.wqkv.M16384", "llama3-70b-tp8.wo.M16384",
)
GLUON_SHAPE_NAMES = (
    "4096x4096x4096", "8192x8192x8192", "16384x16384x16384", "llama3-8b.wqkv.M8192", "llama3-8b.w2.M8192",
    "llama3-70b-tp8.wo.M16384",
)
# Lighter than STEADY: 1 s repeats under the power cap would make the ~90 cases of `gluon` take 6 minutes.
GLUON_TIMING = TimingConfig(repeats=3, settle_ms=200, warmup_ms=25, samples_ms=60, throttled_samples_ms=300,
                            max_dropped_repeats=2)
GROUP_M_VARIANTS = (4, 8, 16)  # row tiles walked together, tried on the best candidates
# Our output against cuBLAS's on the same quantized operands: both round to bf16 (~2e-3 apart) and
# fast accumulation adds a little; a wrong kernel is far beyond this.
AGREEMENT = 1e-2
# A comparison whose two kernels ran at SM clocks this far apart (relative to the faster) measured the clocks as much as
# the kernels: a short sample can land in a dip of the power cap's clock (one ran at 345 MHz beside cuBLAS's 1980).
CLOCK_MISMATCH = 0.1
# How many times a shape and regime's kernels are timed again, all of them, where their clocks ran that far apart.
CLOCK_RETRIES = 1
# One timer for every case of a run. CUPTI's kernel durations by default: with event pairs, a call whose
# host side outlasts the L2 flush before it (our Gluon launch: ~0.3 ms of Python and Triton launcher at
# 4096^3, against cuBLAS's ~0.15) is timed with the GPU waiting for it (reports/h100-sxm/gemm-split-last-wave).
TIMER = typer.Option("cupti", help="cupti (kernel durations) | cuda-events (event pairs, launch gaps included)")
# grad_weight's products: blockwise with both operands in 1 x 128 groups (`wgrad`).
WGRAD_REGIME = "blockwise-1x128/fast_accum=off"
QUICK = TimingConfig(repeats=2, settle_ms=50, warmup_ms=10, samples_ms=25, throttled_samples_ms=300)
STEADY = TimingConfig(repeats=3, settle_ms=200, warmup_ms=25, samples_ms=50)


def target_shapes() -> list[GemmShape]:
    """The comparison's shapes: square 4096 to 16384 and the LLaMa linears."""
    return [s for s in square() if 4096 <= s.M <= 16384] + llama()


def _regime_name(granularity: Granularity, fast_accum: bool) -> str:
    return f"{granularity.value}/fast_accum={'on' if fast_accum else 'off'}"


def parse_regime(name: str) -> tuple[Granularity, bool]:
    """A regime by its name (e.g. blockwise/fast_accum=off): a --regime value of the GEMM tools."""
    for granularity, fast_accum in REGIMES:
        if _regime_name(granularity, fast_accum) == name:
            return granularity, fast_accum
    raise typer.BadParameter(f"unknown regime {name!r}; choose from: {', '.join(_regime_name(*r) for r in REGIMES)}",
                             param_hint="--regime")


def _fast(fast_accum: bool) -> FastAccum:
    return FastAccum.ON if fast_accum else FastAccum.OFF


def _compile_job(granularity: Granularity, fast_accum: bool, config: Fp8GemmConfig) -> tuple[bool, str]:
    """Run one config once on small operands, compiling it into Triton's cache: (ok, what the compiler
    made of it or why it failed)."""
    import torch

    from fp8bench.backends import Operands

    try:
        torch.manual_seed(0)
        M = K = N = 512  # every dimension a multiple of 16, as in the target shapes: the same binary
        operands = Operands(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                            torch.randn(N, K, device="cuda", dtype=torch.bfloat16))
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        kernel = launch_kernel(*kernel_operands(operands, granularity), out, granularity, fast_accum, config)
        torch.cuda.synchronize()
        return True, f"{kernel.n_regs} registers, {kernel.n_spills} spilled, {kernel.metadata.shared} B shared"
    except Exception as err:  # noqa: BLE001 - a config the compiler or the GPU refuses is reported and skipped
        return False, f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:160]}"


def precompile(jobs: list[tuple[Granularity, bool, Fp8GemmConfig]]) -> set[tuple[Granularity, bool, Fp8GemmConfig]]:
    """Compile `jobs` in parallel processes, printing each one's resources; the jobs that failed."""
    workers = max(1, min(len(jobs), (os.cpu_count() or 2) - 2))
    context = multiprocessing.get_context("spawn")
    failed = set()
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        for job, (ok, report) in zip(jobs, pool.map(_compile_job, *zip(*jobs))):
            if not ok:
                failed.add(job)
            console.print(f"{'compiled' if ok else '[yellow]skipped[/]'} {_regime_name(*job[:2])} "
                          f"{config_label(job[2].as_dict())}: {report}", highlight=False)
    return failed


@dataclasses.dataclass(frozen=True)
class Variant:
    """A config of ours timed under a name (`variant` in the summary; "" for the config as given): in `compare`, the
    heuristic's pick's twin that splits no tile, its other multicast form, the pick with config fields forced on, or
    the pick of the heuristic with model constants changed (`settings`, gemm_heuristic_grade.py's --set), run with
    them in place, since the last wave's split is sized at each launch, or the pick run by another copy of the
    kernels (`tree`, --baseline-kernels)."""
    config: Fp8GemmConfig
    name: str = ""
    settings: tuple[tuple[str, float], ...] = ()
    tree: KernelTree | None = None

    def constants(self):
        return changed(list(self.settings)) if self.settings else contextlib.nullcontext()


class SideBySide:
    """Measures cuBLAS and our kernel on one shape's operands and records both rows."""

    def __init__(self, writer: RunWriter, timing: TimingConfig, timer: str, summary: Path | None = None):
        """`summary`: where the side-by-side rows (frame()) go, rewritten after each comparison."""
        import torch

        self.writer, self.timing, self.summary = writer, timing, summary
        self.timers = TimerChoice(timer)
        self.gpu = spec_for_device_name(torch.cuda.get_device_name())
        self.records: list[dict] = []

    def measure_shape(self, shape: GemmShape, regimes, configs_for, ours_first: bool = False) -> None:
        """For each regime, cuBLAS and ours with each config (or Variant) `configs_for(granularity, fast_accum)`
        gives; `ours_first` reverses the order (see _side_by_side), so that alternating it over shapes cancels any drift
        of the clocks."""
        operands = random_operands(shape)
        for granularity, fast_accum in regimes:
            reason = REGISTRY["cublas"].unsupported_reason(shape, granularity, _fast(fast_accum))
            if reason:
                console.print(f"[yellow]{shape.name} {_regime_name(granularity, fast_accum)}: {reason}[/]")
                continue
            cublas = REGISTRY["cublas"].prepare_gemm(operands, granularity, _fast(fast_accum))
            quantized = kernel_operands(operands, granularity)
            ours = [self._ours(shape, quantized, granularity, fast_accum, item if isinstance(item, Variant) else Variant(item))
                    for item in configs_for(granularity, fast_accum)]
            self._side_by_side(shape, granularity, fast_accum, _regime_name(granularity, fast_accum), cublas.run,
                               cublas.options, ours, ours_first)
            del quantized

    @staticmethod
    def _ours(shape: GemmShape, quantized, granularity: Granularity, fast_accum: bool, variant: Variant):
        """(run, options) of our kernel on `variant`'s config; the options name a named variant."""

        # Another copy of the kernels takes its own config class, converted once, outside the timed calls.
        gemm, config = ((fp8_gemm, variant.config) if variant.tree is None else
                        (variant.tree.fp8_gemm, variant.tree.config(variant.config)))

        def run():
            with variant.constants():
                return gemm(*quantized, granularity=granularity, fast_accum=fast_accum, config=config)

        with variant.constants():
            options = variant.config.options_for(shape.M, shape.N, shape.K)
        return run, options | ({"variant": variant.name} if variant.name else {})

    def measure_1x128_both(self, shape: GemmShape, configs: list[Fp8GemmConfig], ours_first: bool = False) -> None:
        """grad_weight's blockwise product, both operands in 1 x 128 groups: cuBLAS (torch._scaled_mm with the
        right operand's scales transposed, as fp8bench.nn's fp8_gemm_1x128_1x128 runs it) and ours with each of
        `configs`; rows carry `"b_scales": "1x128"` in their options."""
        import torch

        from fp8kernels import reference

        operands = random_operands(shape)
        (qa, sa), (qb_t, sb) = ((q, scale.t().contiguous().t()) for q, scale in (
            reference.quantize_blockwise(x.float(), 1, BLOCK) for x in (operands.a, operands.b)))

        def cublas():
            return torch._scaled_mm(qa, qb_t.t(), sa, sb.t(), out_dtype=torch.bfloat16, use_fast_accum=False)

        ours = [(lambda config=config: fp8_gemm(qa, qb_t, sa, sb, granularity=Granularity.BLOCKWISE, config=config),
                 config.options_for(shape.M, shape.N, shape.K) | {"b_scales": "1x128"}) for config in configs]
        self._side_by_side(shape, Granularity.BLOCKWISE, False, WGRAD_REGIME, cublas,
                           {"op": "torch._scaled_mm", "b_scales": "1x128"}, ours, ours_first)

    def _side_by_side(self, shape, granularity, fast_accum, regime: str, cublas_run, cublas_options: dict, ours,
                      ours_first: bool) -> None:
        """Time cuBLAS's run and each of ours (run, options) that agrees with it, in one run, record the rows: cuBLAS
        first and ours in their order, or with `ours_first` all in the reverse order. The clock a case runs at depends
        on what ran before it (on an H200 the case timed right after cuBLAS often ran 400-500 MHz lower than the next:
        reports/h200/gemm-axiswise-scales-by-tma), so a pick and its variants take turns too."""
        cublas_out = cublas_run()
        timed = []  # (backend, run, options, relative difference from cuBLAS)
        for run, options in ours:
            rel = ((run().float() - cublas_out.float()).norm() / cublas_out.float().norm()).item()
            if rel <= AGREEMENT:
                timed.append(("triton", run, options, rel))
            else:
                console.print(f"[red]{shape.name} {regime} {options}: output differs from cuBLAS by {rel:.3g}; not timed[/]")
        timed.insert(0, ("cublas", cublas_run, cublas_options, None))
        if ours_first:
            timed.reverse()
        for attempt in range(CLOCK_RETRIES + 1):
            results = [(backend, options, rel, *self._measure(shape, granularity, fast_accum, backend, run, options))
                       for backend, run, options, rel in timed]
            clocks = [row.values["sm_clock_mhz"] for *_, row in results if row.values["sm_clock_mhz"]]
            if not clocks_apart(clocks) or attempt == CLOCK_RETRIES:
                break
            console.print(f"[yellow]{shape.name} {regime}: timed at {min(clocks):.0f}-{max(clocks):.0f} MHz; "
                          f"timing its kernels again[/]", highlight=False)
        cublas_ms = next(ms for backend, _, _, ms, _ in results if backend == "cublas")
        for backend, options, rel, ms, row in results:
            self.writer.append(row)
            self.records.append({
                "shape": shape.name, "regime": regime, "backend": backend,
                "config": config_label(options) if backend == "triton" else "",
                # The config less its last wave's split, which the heuristic sizes per shape: one tile across shapes.
                "tile": config_label(options | {"split_tiles": 0}) if backend == "triton" else "", "ms": ms,
                "tflops": row.values["tflops"], "ratio": cublas_ms / ms if backend == "triton" else None,
                "rel_diff_vs_cublas": rel, "sm_clock_mhz": row.values["sm_clock_mhz"],
                "split_tiles": options.get("split_tiles", 0) if backend == "triton" else None,
                "variant": options.get("variant", "") if backend == "triton" else "",
            })
        if self.summary is not None:
            write_summary(self.frame(), self.summary)

    def _measure(self, shape, granularity, fast_accum, backend, fn, options):
        """(median ms, result row) of one timed case."""
        case = MatmulCase(shape, backend, granularity, _fast(fast_accum))
        measurement = self.timers.measure(fn, self.timing)
        return measurement.median_ms, measured_row(MatmulBenchmark(self.gpu), GemmCase(case), measurement, options=options)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame.from_records(self.records)


def write_summary(frame: pd.DataFrame, path: Path) -> None:
    """`frame` as CSV at `path`, atomically (a new file renamed over the old one): a run stopped part-way, by a time
    limit or a kill, keeps the summary of the comparisons it finished."""
    partial = path.with_name(path.name + ".partial")
    frame.to_csv(partial, index=False)
    os.replace(partial, path)


def _print_frame(frame: pd.DataFrame, title: str) -> None:
    table = Table(title=title, title_justify="left")
    for column in frame.columns:
        table.add_column(str(column), justify="right" if pd.api.types.is_numeric_dtype(frame[column]) else "left")
    for values in frame.itertuples(index=False):
        table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in values))
    console.print(table)


def _timer(choice: str) -> str:
    if choice not in ("cupti", "cuda-events"):
        raise typer.BadParameter(f"unknown timer {choice!r}; choose cupti or cuda-events", param_hint="--timer")
    return choice


def _require_gpu(command: str) -> None:
    """Exit 1 with one line where no CUDA GPU is visible: every command here times kernels on one."""
    import torch

    if not torch.cuda.is_available():
        console.print(f"[red]gemm_sweep.py {command} times GEMMs on a CUDA GPU and none is visible here "
                      f"(torch {torch.__version__}); run it on an H100 or H200 host.[/]", highlight=False)
        raise typer.Exit(1)


def _open_run(out: Path, command: str) -> RunWriter:
    """The run's writer; its metadata records the command line as given (`command` where there is none), under
    the name of the script run (this one, or gemm_awkward_probe.py, which opens its runs here)."""
    return RunWriter(out, run_metadata(script_command_line(without_arguments=command)))


@app.command()
def compare(out: Path = typer.Option(..., help="folder for results.csv and metadata.json"),
            quick: bool = typer.Option(False, help="lighter timing (2 short repeats)"),
            shape: list[str] = typer.Option([], help="only these shapes (repeatable): target shapes by name (to split "
                                                      "the 27 over runs that must each end within a time limit) or "
                                                      "products of one's own, MxKxN"),
            shape_gen: list[str] = typer.Option([], help="every shape of one of fp8bench's shape sets (repeatable, "
                                                          "beside --shape): " + ", ".join(SHAPE_GENERATORS)),
            reverse: bool = typer.Option(False, help="the shapes in reverse order and each shape's cases in the other "
                                                     "order: with a run without it, every case timed both first and "
                                                     "after the other"),
            regime: list[str] = typer.Option([], help="e.g. blockwise/fast_accum=off (repeatable; default: all five)"),
            unsplit: bool = typer.Option(False, help="also time each config that splits its last wave's tiles "
                                                      "along K without splitting them, side by side"),
            candidate: list[str] = typer.Option([], help="NAME=VALUE, repeatable: also time the pick of the heuristic "
                                                          "with this model constant changed (gemm_heuristic_grade.py "
                                                          "--set), side by side, where it differs"),
            multicast: bool = typer.Option(False, help="also time each Gluon pick in its other form, "
                                                        "side by side: as a cluster of two CTAs multicasting B "
                                                        "(cluster_m 2), or as one CTA where the pick is a cluster"),
            fields: list[str] = typer.Option([], help="a JSON object of config fields, repeatable (e.g. '{\"num_stages\": "
                                                      "5, \"split_last_wave\": false}'): also time each pick with them "
                                                      "forced on, side by side, where that changes it and the regime "
                                                      "takes it"),
            baseline_kernels: Path | None = typer.Option(None, help="another checkout's kernels/ (or a copy of it): also "
                                                                     "time each pick with those kernels, side by side "
                                                                     "on the same operands (variant `baseline`)"),
            timer: str = TIMER) -> None:
    """The heuristic's config on every target shape, each regime against cuBLAS."""
    import torch

    timer = _timer(timer)
    shapes = compared_shapes(shape, shape_gen)
    regimes = [parse_regime(name) for name in regime] or list(REGIMES)
    try:
        settings = tuple(parse_setting(text) for text in candidate)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--candidate") from None
    forced = forced_fields(fields)
    candidate_name = ", ".join(candidate)
    try:
        baseline = KernelTree(baseline_kernels) if baseline_kernels else None
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--baseline-kernels") from None
    _require_gpu("compare")
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    cuda = torch.device("cuda")

    def pick(shape: GemmShape, granularity: Granularity, fast_accum: bool) -> Fp8GemmConfig:
        return gemm_config(shape.M, shape.N, shape.K, granularity, fast_accum, cuda)

    # Once per shape and regime, for the compiles and the timing alike.
    variants = {(s.name, g, f): pick_variants(s, g, f, pick, unsplit=unsplit, settings=settings,
                                              candidate_name=candidate_name, multicast=multicast, forced=forced,
                                              baseline=baseline)
                for s in shapes for g, f in regimes}
    precompile(sorted({(g, f, v.config) for (_, g, f), timed in variants.items() for v in timed}, key=str))
    with _open_run(out, "compare") as writer:
        bench = SideBySide(writer, QUICK if quick else STEADY, timer, out / "summary.csv")
        for shape, ours_first in timing_order(shapes, reverse):
            bench.measure_shape(shape, regimes, lambda g, f, s=shape: variants[(s.name, g, f)], ours_first=ours_first)
            console.print(f"{shape.name} done", highlight=False)
    frame = bench.frame()
    ours = frame[frame.backend == "triton"]
    heuristic = ours[ours.variant == ""]
    cublas = frame[frame.backend == "cublas"][["shape", "regime", "tflops"]]
    per_shape = heuristic.merge(cublas.rename(columns={"tflops": "cublas_tflops"}), on=["shape", "regime"])
    table = per_shape.pivot(index="shape", columns="regime", values="ratio").reindex([s.name for s in shapes])
    _print_frame(table.reset_index(), f"our time / cuBLAS time inverted (ratio > 1: ours faster), {num_sms} SMs")
    summary = per_shape.groupby("regime").agg(
        geomean_ratio=("ratio", gmean), min_ratio=("ratio", "min"), ours_tflops=("tflops", "median"),
        cublas_tflops=("cublas_tflops", "median"), shapes=("ratio", "size"))
    _print_frame(summary.reset_index(), f"geometric mean of our/cuBLAS speed over {len(shapes)} shapes")
    mismatched = clock_mismatches(frame)
    if len(mismatched):
        console.print(f"[yellow]{len(mismatched)} comparisons ran ours and cuBLAS at SM clocks more than "
                      f"{CLOCK_MISMATCH:.0%} apart, timed again {CLOCK_RETRIES} time(s): their ratios measure the "
                      f"clock too[/]")
        _print_frame(mismatched, "comparisons at different SM clocks")
    for variant, title in (("unsplit", "the pick's twin that splits no tile: our time split / unsplit"),
                           ("multicast", "the pick's twin as a 2-CTA cluster multicasting B, or as one CTA where the pick "
                                          "is a cluster: our time / the twin's"),
                           (candidate_name, f"the heuristic with {candidate_name}: our time with its pick now / with this"),
                           *((name, f"the pick with {name} forced: our time / the twin's") for name in forced),
                           ("baseline" if baseline else "", f"the pick on the kernels of {baseline_kernels}: our time "
                                                            f"with this checkout's kernels / with those")):
        if variant:  # no --candidate: its name is the pick's own ""
            _print_variant_gains(per_shape, ours[ours.variant == variant], variant, title)


@app.command("both-orders")
def both_orders(first: Path = typer.Argument(..., help="a compare run's folder (its summary.csv)"),
                reversed_run: Path = typer.Argument(..., metavar="REVERSED", help="the same compare run with --reverse")
                ) -> None:
    """Each variant (--candidate, --fields, --unsplit, --multicast, --baseline-kernels) against the heuristic's pick, over
    two compare runs of the same cases in opposite orders: per variant and regime, the comparisons, the geomean, lowest
    and highest of the pick's speed over the variant's (above 1: the pick is faster), and ours / cuBLAS with the pick
    and with the variant, per order. No GPU: it reads the runs' summary.csv."""
    runs = {"first": _read_summary(first), "reversed": _read_summary(reversed_run)}
    speeds = pd.concat([pick_speeds(frame).assign(order=order) for order, frame in runs.items()], ignore_index=True)
    if speeds.empty:
        console.print(f"[red]no variant was timed beside a pick in {first} and {reversed_run}[/]")
        raise typer.Exit(1)
    for variant, rows in speeds.groupby("variant", sort=False):
        per_regime = [("all", rows), *rows.groupby("regime", sort=True)]
        _print_frame(pd.DataFrame([dict(
            regime=regime, comparisons=len(part), shapes=part.shape_name.nunique(),
            pick_speed=gmean(part.pick_speed), lowest=part.pick_speed.min(), highest=part.pick_speed.max(),
            **{f"{kind}_{order}": gmean(part[part.order == order][f"{kind}_vs_cublas"])
               for order in runs for kind in ("pick", "variant")}) for regime, part in per_regime]),
            f"{variant}: the pick's speed over the variant's in both orders, and ours / cuBLAS per order where it "
            f"differs")


def _read_summary(folder: Path) -> pd.DataFrame:
    """A compare run's summary.csv; a missing or malformed one exits 2 naming the file."""
    path = folder / "summary.csv"
    try:
        frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    except (OSError, ValueError) as err:
        console.print(f"[red]{path}: cannot read a compare summary: {err}[/]")
        raise typer.Exit(2) from None
    missing = {"shape", "regime", "backend", "ms", "variant"} - set(frame.columns)
    if missing:
        console.print(f"[red]{path}: not a compare summary, no column {', '.join(sorted(missing))}[/]")
        raise typer.Exit(2)
    frame["variant"] = frame.variant.astype("string").fillna("")  # all empty: read as float
    return frame


def pick_speeds(summary: pd.DataFrame) -> pd.DataFrame:
    """Per variant, shape and regime of one compare summary where a variant was timed beside the pick: the pick's
    speed over the variant's (variant ms / pick ms), and each one's ours / cuBLAS (cuBLAS ms / ours)."""
    timed = summary[summary.ms.notna()]
    cublas = timed[timed.backend == "cublas"][["shape", "regime", "ms"]].rename(columns={"ms": "cublas_ms"})
    ours = timed[timed.backend == "triton"].merge(cublas, on=["shape", "regime"])
    picks = ours[ours.variant == ""][["shape", "regime", "ms", "cublas_ms"]]
    twins = ours[ours.variant != ""][["shape", "regime", "variant", "ms"]].rename(columns={"ms": "variant_ms"})
    paired = picks.merge(twins, on=["shape", "regime"])
    return pd.DataFrame({
        "variant": paired.variant, "shape_name": paired["shape"], "regime": paired.regime,
        "pick_speed": paired.variant_ms / paired.ms, "pick_vs_cublas": paired.cublas_ms / paired.ms,
        "variant_vs_cublas": paired.cublas_ms / paired.variant_ms})


def clocks_apart(clocks: list[float]) -> bool:
    """Whether SM clocks read beside each other differ by more than CLOCK_MISMATCH of the highest (none: False)."""
    return bool(clocks) and max(clocks) - min(clocks) > CLOCK_MISMATCH * max(clocks)


def clock_mismatches(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of ours (a SideBySide frame) whose SM clock and that of cuBLAS beside them, in the same shape and
    regime, differ by more than CLOCK_MISMATCH of the higher: shape, regime, config, ratio and both clocks."""
    cublas = frame[frame.backend == "cublas"][["shape", "regime", "sm_clock_mhz"]]
    ours = frame[frame.backend == "triton"].merge(cublas, on=["shape", "regime"], suffixes=("", "_cublas"))
    apart = [clocks_apart([mine, theirs]) for mine, theirs in zip(ours.sm_clock_mhz, ours.sm_clock_mhz_cublas)]
    return ours.loc[apart][["shape", "regime", "config", "ratio", "sm_clock_mhz", "sm_clock_mhz_cublas"]].reset_index(drop=True)


def pick_variants(s: GemmShape, g: Granularity, f: bool, pick: Callable[[GemmShape, Granularity, bool], Fp8GemmConfig],
                  unsplit: bool = False, settings: tuple[tuple[str, float], ...] = (), candidate_name: str = "",
                  multicast: bool = False, forced: dict[str, dict] | None = None,
                  baseline: KernelTree | None = None) -> list[Variant]:
    """What `compare` times of ours on one shape and regime: the heuristic's `pick` and, as asked, its twin that
    splits no tile, the heuristic's pick with model constants changed (`settings`), its other multicast form, and
    the pick with each of `forced`'s config fields on (name -> fields), each where it differs from the pick; and
    the pick on the `baseline` copy of the kernels."""
    config = pick(s, g, f)
    variants = [Variant(config)]
    if unsplit and last_wave_split(s.M, s.N, s.K, config)[0]:
        variants.append(Variant(dataclasses.replace(config, split_last_wave=False), "unsplit"))
    if settings:
        picked = config.options_for(s.M, s.N, s.K)
        with changed(list(settings)):  # its split too: sized by the constants
            candidate = pick(s, g, f)
            moved = candidate.options_for(s.M, s.N, s.K) != picked
        variants += [Variant(candidate, candidate_name, settings)] if moved else []
    if multicast and config.gluon_ws and not config.right_columns:  # the pick's other form (a composite has none)
        twin = (dataclasses.replace(config, cluster_m=1) if config.cluster_m == 2 else
                dataclasses.replace(config, dynamic_tiles=False, cluster_m=2))
        variants.append(Variant(twin, "multicast"))
    for name, fields in (forced or {}).items():
        twin = forced_twin(config, name, fields, g, f, BLOCK, f"{s.name} {_regime_name(g, f)}")
        # A twin another --fields object made already (or the pick itself) is timed once, under its first name.
        variants += [Variant(twin, name)] if twin is not None and twin not in [v.config for v in variants] else []
    if baseline is not None:
        variants.append(Variant(config, "baseline", tree=baseline))
    return variants


def forced_fields(texts: list[str]) -> dict[str, dict]:
    """--fields' JSON objects of config fields, each by the name its twin's rows carry (`fields {...}`); a malformed
    one exits 2 naming the option."""
    try:
        return {f"fields {json.dumps(parsed, separators=(',', ':'))}": parsed
                for parsed in (parse_config_fields(text) for text in texts)}
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--fields") from None


def forced_twin(config: Fp8GemmConfig, name: str, fields: dict, granularity: Granularity, fast_accum: bool,
                b_scale_rows: int, where: str) -> Fp8GemmConfig | None:
    """`config` with `fields` forced on, or None where that is no config the regime takes (said, naming `where`)."""
    try:
        twin = dataclasses.replace(config, **fields)
        twin.check_granularity(granularity, fast_accum, b_scale_rows)
    except ValueError as err:  # e.g. a ring over the shared memory, or a tile the regime cannot take
        console.print(f"[yellow]{where}: {name} not timed: {err}[/]")
        return None
    return twin


def compared_shapes(names: list[str], shape_sets: list[str] = ()) -> list[GemmShape]:
    """`compare`'s shapes: every target shape, or those `names` gives (a target shape's name, or MxKxN) and every shape
    of the fp8bench shape sets `shape_sets` names; a product named twice is timed once, where it first comes."""
    targets = {s.name: s for s in target_shapes()}
    if not names and not shape_sets:
        return list(targets.values())
    unknown_sets = [name for name in shape_sets if name not in SHAPE_GENERATORS]
    if unknown_sets:
        raise typer.BadParameter(f"unknown shape sets {', '.join(unknown_sets)}; choose from: "
                                 f"{', '.join(SHAPE_GENERATORS)}", param_hint="--shape-gen")
    shapes, unknown = [], []
    for name in names:
        try:
            shapes.append(targets[name] if name in targets else parse_product(name))
        except ValueError:
            unknown.append(name)
    if unknown:
        raise typer.BadParameter(f"not target shapes nor MxKxN products: {', '.join(unknown)}", param_hint="--shape")
    products: dict[tuple[int, int, int], GemmShape] = {}
    for shape in [*shapes, *(s for name in shape_sets for s in SHAPE_GENERATORS[name]())]:
        products.setdefault((shape.M, shape.K, shape.N), shape)
    return list(products.values())


def timing_order(shapes: list[GemmShape], reverse: bool = False) -> list[tuple[GemmShape, bool]]:
    """(shape, whether ours is timed before cuBLAS) in the order `compare` times them: every other shape ours first, so
    that the clock's dip after cuBLAS falls on each side alike; `reverse` runs the shapes backwards with each one's
    cases the other way round, so that two runs, one of each, time every case in both orders."""
    order = [(shape, (index % 2 == 1) != reverse) for index, shape in enumerate(shapes)]
    return order[::-1] if reverse else order


def _print_variant_gains(per_shape: pd.DataFrame, twins: pd.DataFrame, variant: str, title: str) -> None:
    """Where `twins` (a variant's rows) were timed beside the heuristic's pick: each shape's and regime's gain (the
    pick's time over the variant's: above 1, the variant is faster), then per regime, the geomean of ours / cuBLAS
    over every shape with the variant's time where it has one."""
    if twins.empty:
        return
    gains = per_shape.merge(twins[["shape", "regime", "ratio", "config"]].rename(
        columns={"ratio": "variant_ratio", "config": "variant_config"}), on=["shape", "regime"])
    gains["gain"] = gains.variant_ratio / gains.ratio
    _print_frame(gains[["shape", "regime", "config", "variant_config", "gain"]], f"{title}, where it differs")
    with_variant = per_shape.merge(gains[["shape", "regime", "variant_ratio"]], on=["shape", "regime"], how="left")
    with_variant["changed"] = with_variant.variant_ratio.notna()
    with_variant["variant_ratio"] = with_variant.variant_ratio.fillna(with_variant.ratio)
    _print_frame(with_variant.groupby("regime").agg(
        geomean_ratio=("ratio", gmean), geomean_ratio_with_variant=("variant_ratio", gmean),
        shapes_changed=("changed", "sum")).reset_index(),
        f"{variant}: ours / cuBLAS, geomean per regime, the heuristic's picks and with the variant's where it has one")


@app.command()
def tune(out: Path = typer.Option(..., help="folder for results.csv and metadata.json"),
         promoted_only: bool = typer.Option(False, help="only the regimes that promote (fast accumulation off)"),
         blockwise_only: bool = typer.Option(False, help="only blockwise scaling"),
         timer: str = TIMER) -> None:
    """Every candidate config on the tuning shapes; then group_m variants of the best three per regime."""
    import torch

    timer = _timer(timer)
    _require_gpu("tune")
    device = device_properties(torch.device("cuda"))
    shapes = [s for s in target_shapes() if s.name in TUNING_SHAPE_NAMES]
    regimes = [(g, f) for g, f in TUNED_REGIMES
               if not (promoted_only and f) and not (blockwise_only and g is not Granularity.BLOCKWISE)]
    candidates = {(g, f): candidate_configs(g, f, device) for g, f in regimes}
    with _open_run(out, "tune") as writer:
        bench = SideBySide(writer, QUICK, timer, out / "summary.csv")
        _tune_round(bench, shapes, candidates)
        frame = bench.frame()
        variants = {}
        for (g, f), configs in candidates.items():
            ranked = _rank(frame, _regime_name(g, f))
            best = [c for c in configs if config_label(c.as_dict()) in ranked.index[:3]]
            variants[(g, f)] = [dataclasses.replace(c, group_m=m) for c in best for m in GROUP_M_VARIANTS if m != c.group_m]
        _tune_round(bench, shapes, variants)
    frame = bench.frame()
    for g, f in regimes:
        regime = _regime_name(g, f)
        _print_frame(_rank(frame, regime).head(12).reset_index(), f"{regime}: geomean of our/cuBLAS speed per config")
        mine = frame[(frame.regime == regime) & (frame.backend == "triton")]
        best = mine.loc[mine.groupby("shape")["ratio"].idxmax(), ["shape", "config", "tflops", "ratio"]]
        _print_frame(best, f"{regime}: best config per shape")


@app.command()
def gluon(out: Path = typer.Option(..., help="folder for results.csv, summary.csv and metadata.json"),
          granularity: list[Granularity] = typer.Option(list(Granularity.fp8()), help="the granularities to run"),
          fast_accum: bool = typer.Option(False, help="fast accumulation (tensorwise, axiswise) instead of promoted"),
          timer: str = TIMER) -> None:
    """The Gluon kernel's candidates (warp-specialized, kernels/_gemm_ws.py) beside the Triton kernel's
    preset, each regime against cuBLAS, on a few shapes."""
    import torch

    timer = _timer(timer)
    _require_gpu("gluon")
    device = device_properties(torch.device("cuda"))
    shapes = [s for s in target_shapes() if s.name in GLUON_SHAPE_NAMES]
    candidates = {
        (g, fast_accum): [choose_config(BLOCK, BLOCK, BLOCK, g, fast_accum, device, gluon=False)]
        + [c for c in candidate_configs(g, fast_accum, device) if c.gluon_ws]
        for g in granularity
        if not (fast_accum and g is Granularity.BLOCKWISE)  # blockwise always promotes
    }
    with _open_run(out, "gluon") as writer:
        bench = SideBySide(writer, GLUON_TIMING, timer, out / "summary.csv")
        _tune_round(bench, shapes, candidates)
    frame = bench.frame()
    for g, f in candidates:
        _print_frame(_rank(frame, _regime_name(g, f)).reset_index(), f"{_regime_name(g, f)}: geomean of our/cuBLAS speed per config")


@app.command()
def wgrad(out: Path = typer.Option(..., help="folder for results.csv, summary.csv and metadata.json"),
          quick: bool = typer.Option(False, help="lighter timing (2 short repeats)"),
          fields: list[str] = typer.Option([], help="a JSON object of config fields, repeatable: time the heuristic's "
                                                    "pick and the pick with each of these forced on, instead of every "
                                                    "candidate"),
          both_orders: bool = typer.Option(False, help="time each shape twice, cuBLAS first and ours first (the clock "
                                                       "a case runs at depends on what ran before it)"),
          timer: str = TIMER) -> None:
    """grad_weight's blockwise products (both operands in 1 x 128 groups, as a training step's backward runs
    them): ours with the heuristic's config and the autotuner's other candidates (tuning_candidates), or with
    --fields the pick and its forced twins, against cuBLAS, on a LLaMa-3 8B training step's grad_weight products
    and the square 4096^3, 8192^3 and 16384^3 (the roofline layer's)."""
    import torch

    timer = _timer(timer)
    forced = forced_fields(fields)
    _require_gpu("wgrad")
    cuda = torch.device("cuda")
    device = device_properties(cuda)
    shapes = [s for s in training() if ".grad_weight." in s.name] + [s for s in square() if s.M in (4096, 8192, 16384)]

    def configs(shape: GemmShape) -> list[Fp8GemmConfig]:
        if not forced:
            return tuning_candidates(shape.M, shape.N, shape.K, Granularity.BLOCKWISE, False, device,
                                     gluon_runs_on(cuda), 1)
        config = choose_config(shape.M, shape.N, shape.K, Granularity.BLOCKWISE, False, device, gluon_runs_on(cuda), 1)
        twins = (forced_twin(config, name, fields, Granularity.BLOCKWISE, False, 1, shape.name)
                 for name, fields in forced.items())
        return list(dict.fromkeys([config, *(twin for twin in twins if twin is not None)]))

    orders = (False, True) if both_orders else (False, )
    with _open_run(out, "wgrad") as writer:
        bench = SideBySide(writer, QUICK if quick else STEADY, timer, out / "summary.csv")
        for shape, ours_first in timing_order(shapes):
            timed = configs(shape)
            for flipped in orders:
                bench.measure_1x128_both(shape, timed, ours_first=ours_first != flipped)
            console.print(f"{shape.name} done", highlight=False)
    frame = bench.frame()
    ours = frame[frame.backend == "triton"]
    _print_frame(ours.pivot_table(index="shape", columns="tile", values="ratio", aggfunc=gmean).reset_index(),
                 f"{WGRAD_REGIME}: cuBLAS time / ours, per config" + (" (geomean of both orders)" if both_orders else ""))
    _print_frame(_rank(frame, WGRAD_REGIME).reset_index(), f"{WGRAD_REGIME}: geomean of our/cuBLAS speed per config")


def _tune_round(bench: SideBySide, shapes, candidates: dict) -> None:
    jobs = [(g, f, c) for (g, f), configs in candidates.items() for c in configs]
    failed = precompile(jobs)
    for shape, ours_first in timing_order(shapes):
        bench.measure_shape(shape, list(candidates),
                            lambda g, f: [c for c in candidates[(g, f)] if (g, f, c) not in failed], ours_first=ours_first)
        console.print(f"{shape.name} done", highlight=False)


def _rank(frame: pd.DataFrame, regime: str) -> pd.DataFrame:
    """Tiles (configs less their last wave's split) timed on every shape, by geometric-mean ratio to cuBLAS, best
    first."""
    mine = frame[(frame.regime == regime) & (frame.backend == "triton")]
    complete = mine.groupby("tile").filter(lambda g: g["shape"].nunique() == mine["shape"].nunique())
    ranked = complete.groupby("tile").agg(geomean_ratio=("ratio", gmean), min_ratio=("ratio", "min"),
                                            median_tflops=("tflops", "median"))
    return ranked.sort_values("geomean_ratio", ascending=False)


if __name__ == "__main__":
    app()
