"""The `fp8bench` command line (Typer). Each command parses its options into fp8bench.config objects
once, then hands them to the module that does the work."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import os
import shlex
import sys
from datetime import datetime
from pathlib import Path
from typing import Optional

import typer
import typer.core
from rich.console import Console
from rich.markup import escape

from fp8bench.config import (
    FAST_ACCUM_CHOICES,
    GRANULARITY_CHOICES,
    OPERAND_DTYPE_CHOICES,
    MatmulConfig,
    TimingConfig,
    parse_choice,
)
from fp8bench.nn.recipes import RECIPE_CHOICES

# Every preset by name, `all` (the e4m3 presets, the default) and `hybrid` (the e5m2-gradient ones).
_RECIPE_HELP = f"repeatable; {' | '.join(name for name in RECIPE_CHOICES if name != 'all')} | all (default)"

# Logs of runs on GPU hosts are not terminals: rich would wrap the result tables at 80 columns.
_LOG_WIDTH = None if sys.stdout.isatty() else 180
console = Console(width=_LOG_WIDTH)
err_console = Console(stderr=True, width=_LOG_WIDTH)


class EnvironmentProblem(Exception):
    """Something this machine lacks (a GPU, a library); printed as one line, exit code 1."""


def _error_exit_code(err: Exception) -> tuple[int, str] | None:
    """The exit code and prefix of an error a user can act on, or None for a bug (its traceback shows)."""
    from fp8bench.gate.baseline import IncompatibleBaseline
    from fp8bench.gate.compare import ExitCode
    from fp8bench.harness.validate import MalformedFile, UsageError

    if isinstance(err, (MalformedFile, UsageError)):
        return int(ExitCode.USAGE), "error"
    if isinstance(err, IncompatibleBaseline):
        return int(ExitCode.INCOMPATIBLE_BASELINE), "incompatible baseline"
    if isinstance(err, EnvironmentProblem):
        return 1, "error"
    return None


class _HelpGroup(typer.core.TyperGroup):
    """A command group whose help lists each command's first sentence in full, wrapped to the terminal
    (click would cut it to one line with "...")."""

    def format_commands(self, ctx, formatter) -> None:
        commands = [(name, self.get_command(ctx, name)) for name in self.list_commands(ctx)]
        rows = [(name, command.get_short_help_str(limit=sys.maxsize)) for name, command in commands if command and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class _Commands(_HelpGroup):
    """The command line's one error adapter: a malformed input file or bad usage (exit 2), a baseline
    from another GPU model (4) or a missing GPU (1) is one line on stderr, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except Exception as err:  # noqa: BLE001 - mapped or re-raised just below
            mapped = _error_exit_code(err)
            if mapped is None:
                raise
            code, prefix = mapped
            from fp8bench.harness.validate import printable

            err_console.print(f"[red]{prefix}:[/] {escape(printable(str(err)))}", soft_wrap=True, highlight=False)
            raise typer.Exit(code) from None


# Help as click writes it: wrapped to the terminal (80 columns included), where rich's option panels
# cut long defaults and paths with "…".
_HELP = {"rich_markup_mode": None, "no_args_is_help": True, "cls": _HelpGroup}

app = typer.Typer(
    help="Benchmarks and roofline analysis for FP8 training on NVIDIA Hopper GPUs.",
    pretty_exceptions_enable=False,
    add_completion=False,
    **{**_HELP, "cls": _Commands},  # the command line's error adapter at the top
)


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        console.print(f"fp8bench {version('fp8bench')}", highlight=False)
        raise typer.Exit()


@app.callback()
def _app(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="print the version and exit"),
) -> None:
    """Benchmarks and roofline analysis for FP8 training on NVIDIA Hopper GPUs."""


def choice(value: str, choices: dict, what: str) -> tuple:
    """Parse an option value, turning a bad one into a usage error (exit code 2) listing the choices."""
    try:
        return parse_choice(value, choices, what)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def require_cuda(command: str) -> str:
    """The CUDA device name, or an EnvironmentProblem that says what is needed."""
    import torch

    if not torch.cuda.is_available():
        built = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA"
        raise EnvironmentProblem(
            f"fp8bench {command} measures on a CUDA GPU and none is visible here (torch {torch.__version__}, "
            f"built with {built}); run it on a host with an H100/H200 and a CUDA build of torch."
        )
    return torch.cuda.get_device_name()


def default_run_dir(benchmark: str, label: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{benchmark}-{label}"


def command_line() -> str:
    return shlex.join(["fp8bench", *sys.argv[1:]])


@app.command()
def matmul(
    shape_gen: str = typer.Option("square", help="square | pow2-extended | llama | training (every product of a LLaMa-3 8B training step) | sweep | dsv3 | awkward (moe, tp-shards, unaligned, small-m) | custom"),
    granularity: str = typer.Option("all", help="tensorwise | axiswise (alias rowwise) | blockwise | all"),
    backend: Optional[list[str]] = typer.Option(None, help="repeatable; default: every backend but triton-tuned (ours on the autotuner's configs: tunes each new problem first)"),
    fast_accum: str = typer.Option("both", help="on | off | both"),
    dtypes: str = typer.Option("e4m3", help="FP8 operand dtypes: e4m3 (both) | e5m2xe4m3 (an e5m2 gradient x e4m3) | all"),
    M: Optional[int] = typer.Option(None, "--M", help="with --shape-gen custom"),
    K: Optional[int] = typer.Option(None, "--K", help="with --shape-gen custom"),
    N: Optional[int] = typer.Option(None, "--N", help="with --shape-gen custom"),
    shape_name: Optional[list[str]] = typer.Option(None, help="repeatable; keep the shapes whose name contains this (e.g. moe.dsv3.)"),
    shape: Optional[list[str]] = typer.Option(None, "--shape", help="with --shape-gen custom: a product MxKxN, repeatable"),
    repeats: int = typer.Option(5, min=1, help="independent repeats per case (each with its own warm-up)"),
    timer: str = typer.Option("auto", help="auto | cuda-events | cupti"),
    gpu: str = typer.Option("auto", help="GPU model for % of peak: auto (detect) or a hardware-table key"),
    out: Optional[Path] = typer.Option(None, help="run folder (default runs/<time>-matmul-<shape-gen>)"),
    resume: bool = typer.Option(
        False, help="continue the run in --out with the same options: its finished shapes are kept, the rest measured"
    ),
    report: bool = typer.Option(True, help="write the HTML reports when the run ends"),
) -> None:
    """One FP8 GEMM per backend and granularity against BF16: time, TFLOPS, % of peak, speedup."""
    _resume_needs_out(resume, out)
    from fp8bench.benchmarks import shapes
    from fp8bench.backends import Level, backend_names, default_backend_names
    from fp8bench.model.hardware import resolve_gpu
    from fp8bench.harness.timing import TIMER_CHOICES

    granularities = choice(granularity, GRANULARITY_CHOICES, "granularity")
    fast_accums = choice(fast_accum, FAST_ACCUM_CHOICES, "fast-accum setting")
    operand_dtypes = choice(dtypes, OPERAND_DTYPE_CHOICES, "operand dtypes")
    if timer not in TIMER_CHOICES:
        raise typer.BadParameter(f"unknown timer {timer!r}; choose one of: {', '.join(TIMER_CHOICES)}")
    try:
        shape_list = shapes.generate(shape_gen, M, K, N, shape_name or (), shape or ())
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    backends = tuple(backend or default_backend_names(Level.GEMM))
    unknown = [name for name in backends if name not in backend_names(Level.GEMM)]
    if unknown:
        raise typer.BadParameter(f"unknown backend {unknown[0]!r}; choose from: {', '.join(backend_names(Level.GEMM))}")
    config = MatmulConfig(tuple(shape_list), granularities, backends, fast_accums, TimingConfig(repeats=repeats),
                          operand_dtypes)
    device_name = require_cuda("matmul")
    try:
        spec = resolve_gpu(gpu, device_name)
    except ValueError as err:
        if gpu != "auto":
            raise typer.BadParameter(str(err)) from None
        err_console.print(f"[yellow]{err}; % of peak is left empty[/]")
        spec = None
    from fp8bench.benchmarks.matmul import MatmulBenchmark
    from fp8bench.harness.timing import TimerChoice

    benchmark = MatmulBenchmark(spec)
    clock = TimerChoice(timer, config.timing.flush_l2)
    run_dir = _run_benchmark(benchmark, benchmark.cases(config), clock, config.timing, shape_gen, out, report, spec, resume=resume)
    if run_dir and "triton-tuned" in backends:
        _keep_tuned_configs(run_dir, shape_list, device_name)


def _keep_tuned_configs(run_dir: Path, shape_list, device_name: str) -> None:
    """The autotuner's entries for the run's products, beside its results (TUNE_CACHE_JSON): each picked config
    with every candidate's time, which the GPU model's cache file keeps only until it is deleted or moved."""
    from fp8bench.harness.results import TUNE_CACHE_JSON
    from fp8kernels.gemm_autotune import TuneCache, cache_path

    try:
        kept = TuneCache(cache_path(device_name)).copy_problems({(s.M, s.N, s.K) for s in shape_list}, run_dir / TUNE_CACHE_JSON)
    except ValueError as err:  # a malformed cache file: its rows are `failed:` rows already
        err_console.print(f"[yellow]tuned configs not kept: {err}[/]")
        return
    if kept:
        console.print(f"tuned configs: {run_dir / TUNE_CACHE_JSON} ({kept} problems)")


@app.command()
def cast(
    shape_gen: str = typer.Option("square", help="square | llama | custom (tensors M rows x K columns)"),
    recipe: Optional[list[str]] = typer.Option(None, help="repeatable; default all: tensorwise | tensorwise-delayed (scale from a known amax) | axiswise | blockwise-1x128 | blockwise-128x128, each also with +t (the transposed copy too)"),
    backend: Optional[list[str]] = typer.Option(None, help="repeatable; triton | torch | torch-compile | te (default: all)"),
    dtype: str = typer.Option("e4m3", help="fp8 format: e4m3 | e5m2"),
    input_dtype: str = typer.Option("bf16", help="bf16 | fp16 | fp32"),
    power_of_two: bool = typer.Option(False, help="floor scales to powers of two"),
    M: Optional[int] = typer.Option(None, "--M", help="rows, with --shape-gen custom"),
    K: Optional[int] = typer.Option(None, "--K", help="columns, with --shape-gen custom"),
    repeats: int = typer.Option(5, min=1, help="independent repeats per case (each with its own warm-up)"),
    timer: str = typer.Option("auto", help="auto | cuda-events | cupti"),
    out: Optional[Path] = typer.Option(None, help="run folder (default runs/<time>-cast-<shape-gen>)"),
    resume: bool = typer.Option(
        False, help="continue the run in --out with the same options: its finished tensors are kept, the rest measured"
    ),
    report: bool = typer.Option(True, help="write the HTML reports when the run ends"),
) -> None:
    """FP8 quantize kernels: GPU time, GB/s and % of the copy bandwidth, ours against torch, torch.compile and TE."""
    _resume_needs_out(resume, out)
    from fp8bench.benchmarks.cast import (
        IMPLEMENTATIONS, RECIPE_CHOICES, CastBenchmark, CastConfig, generate_shapes, print_cast_row, print_cast_summary,
    )
    from fp8bench.model.hardware import spec_for_device_name
    from fp8bench.nn.recipes import Fp8Dtype
    from fp8bench.harness.timing import TIMER_CHOICES, TimerChoice

    recipes = tuple(dict.fromkeys(r for name in recipe or ["all"] for r in choice(name, RECIPE_CHOICES, "recipe")))
    fp8_dtype = choice(dtype, {d.value: (d,) for d in Fp8Dtype}, "fp8 dtype")[0]
    if timer not in TIMER_CHOICES:
        raise typer.BadParameter(f"unknown timer {timer!r}; choose one of: {', '.join(TIMER_CHOICES)}")
    try:
        shape_list = generate_shapes(shape_gen, M, K)
        config = CastConfig(
            tuple(shape_list), recipes, tuple(dict.fromkeys(backend or IMPLEMENTATIONS)), fp8_dtype,
            input_dtype, power_of_two, TimingConfig(repeats=repeats),
        )  # fmt: skip
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    spec = spec_for_device_name(require_cuda("cast"))  # recorded with the run; the copy is the ceiling
    benchmark = CastBenchmark(config)
    clock = TimerChoice(timer, config.timing.flush_l2)
    printers = (print_cast_row, print_cast_summary)
    _run_benchmark(benchmark, benchmark.cases(), clock, config.timing, shape_gen, out, report, spec, printers, resume)


def _run_benchmark(
    benchmark, cases, clock, timing: TimingConfig, label: str, out: Optional[Path], report: bool, spec,
    printers=None, resume: bool = False,
) -> Path | None:
    """Open the run folder, run the cases through the harness (fp8bench.harness.runner), print the table,
    write reports; the run folder (None where only the plan was printed).

    `printers` is (print_row, print_summary) for benchmarks whose rows are not GEMMs (default: console's).
    `resume` continues the run in `out`: its finished groups are kept, the rest measured, its metadata
    kept inside the new metadata. Ctrl-C stops the run; every finished case is already in the CSV and the
    reports cover them.
    """
    from fp8bench.report.console import print_row, print_summary
    from fp8bench.harness.env import run_metadata
    from fp8bench.harness.runner import run_cases

    if _planned(benchmark, clock, timing):
        return None
    show_row, show_summary = printers or (print_row, print_summary)
    run_dir = out or default_run_dir(benchmark.name, label)
    metadata = run_metadata(
        command_line(), {"benchmark": benchmark.name, "gpu_spec": spec.key if spec else None, "timing": dataclasses.asdict(timing)}
    )
    if resume:
        cases, metadata["resumed_from"] = _resumed(cases, out)
    interrupted = False
    with _open_run(run_dir, metadata, resume) as writer:
        console.print(f"[bold]{benchmark.name}[/] on {metadata.get('gpu_name')} -> {writer.csv_path}")
        try:
            rows = run_cases(benchmark, cases, writer, clock, timing, lambda row: show_row(console, row))
        except KeyboardInterrupt:
            interrupted = True
            rows = None
    if interrupted:
        err_console.print(f"[yellow]interrupted: the finished cases are in {run_dir / 'results.csv'}[/]")
    else:
        show_summary(console, rows)
    if report:
        _write_pages(run_dir)
    if interrupted:
        raise typer.Exit(130)
    return run_dir


def _write_pages(run_dir: Path) -> None:
    """A run's HTML report (fp8bench.report.write), or a line saying why there is none."""
    try:
        from fp8bench.report.write import write_reports
    except ImportError as err:  # plotly missing on a bare GPU host: the results stand without pages
        err_console.print(f"[yellow]no HTML reports: {err.name} is not installed; `fp8bench report {run_dir}` writes them later[/]")
    else:
        for page in write_reports(run_dir):
            console.print(f"report: {page}")


# Set while `_plan` parses a command: the command hands over what it would run instead of running it.
_PLANNING: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar("planning", default=None)


def _planned(benchmark, clock, timing: TimingConfig) -> bool:
    """Whether `_plan` asked for the command's benchmark (then it has it, and nothing runs)."""
    planning = _PLANNING.get()
    if planning is not None:
        planning.append((benchmark, clock, timing))
    return planning is not None


def _plan(entry, run_dir: Path) -> tuple:
    """(benchmark, clock, timing) that a suite entry's command builds from its options, with `run_dir` as
    its --out: the command's own parsing, so a re-run measures with the entry's settings."""
    from fp8bench.harness.suite import SuiteEntry

    planning: list = []
    token = _PLANNING.set(planning)
    try:
        app(SuiteEntry(run_dir.name, entry.command, entry.options).argv(run_dir.parent), standalone_mode=False)
    finally:
        _PLANNING.reset(token)
    if not planning:
        raise ValueError(f"fp8bench {entry.command} with these options measures nothing here")
    return planning[0]


def _remeasure(entry, case_id, run_dir: Path) -> Optional[Path]:
    """The gate's re-run (fp8bench.gate.gate.Remeasure): the flagged case, from its identity, beside its group's
    reference (fp8bench.harness.runner.rerun), with the entry's settings, into `run_dir`."""
    from fp8bench.harness.env import run_metadata
    from fp8bench.harness.runner import rerun

    try:
        benchmark, clock, timing = _plan(entry, run_dir)
        identity = dataclasses.asdict(case_id)
        extra = {"benchmark": benchmark.name, "rerun_of": case_id.label, "timing": dataclasses.asdict(timing)}
        with _open_run(run_dir, run_metadata(command_line(), extra), resume=False) as writer:
            rerun([identity], writer, {benchmark.name: benchmark}, clock, timing, lambda row: console.print(row.values["status"]))
    except ValueError as err:
        err_console.print(f"[yellow]{case_id.label} cannot be re-run: {err}[/]")
        return None
    return run_dir


def _resume_needs_out(resume: bool, out: Optional[Path]) -> None:
    """A usage error before anything runs: --resume continues the run in a folder that --out names."""
    if resume and out is None:
        raise typer.BadParameter("--resume continues a run: give its folder with --out")


def _require_results(run_dir: Path) -> None:
    """A usage error unless `run_dir` holds a run's results to continue."""
    from fp8bench.harness.results import RESULTS_CSV

    if not (run_dir / RESULTS_CSV).exists():
        raise typer.BadParameter(f"--resume continues a run: {run_dir} holds no {RESULTS_CSV}")


def _resumed(cases: list, out: Path, keep=lambda row: False) -> tuple[list, dict]:
    """The cases the run in `out` has not finished (fp8bench.harness.runner.resume: its CSV keeps the
    finished groups' rows and those `keep` accepts), and that run's metadata for the new one to carry. A run
    measured on another GPU model is a usage error, refused before its CSV is touched: its rows carry no GPU
    name, so the continued run would pass one card's rows for another's."""
    from fp8bench.harness.env import cuda_device_name
    from fp8bench.harness.results import read_metadata
    from fp8bench.harness.runner import resume

    _require_results(out)
    previous = read_metadata(out)
    here = cuda_device_name()
    if here and previous.get("gpu_name") and previous["gpu_name"] != here:
        raise typer.BadParameter(f"--resume continues a run on the GPU model that began it: {out} was measured on "
                                 f"{previous['gpu_name']} and this is {here}; give a new --out")
    try:
        left = resume(cases, out, keep)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    console.print(f"resuming {out}: {len(cases) - len(left)} cases finished, {len(left)} to measure")
    return left, previous


def _open_run(run_dir: Path, metadata: dict, resume: bool):
    """The run's writer; a folder holding another run is a usage error unless resuming."""
    from fp8bench.harness.results import RunWriter

    try:
        return RunWriter(run_dir, metadata, resume)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


@app.command()
def report(
    run: Path = typer.Argument(..., help="a run folder (holding results.csv and metadata.json)"),
    shared_plotly: Optional[Path] = typer.Option(
        None, help="a folder above the run holding the one plotly.min.js many runs share (written if absent)"
    ),
) -> None:
    """(Re)write a run's HTML reports, one page per granularity."""
    from fp8bench.harness.validate import UsageError, usage_errors
    from fp8bench.report.write import write_reports
    from fp8bench.report.html import write_plotly_js

    if not (run / "results.csv").is_file():
        raise UsageError(f"{run} holds no results.csv")
    plotly_dir = None
    if shared_plotly is not None:
        if not run.resolve().is_relative_to(shared_plotly.resolve()):
            raise UsageError(f"--shared-plotly {shared_plotly} is not a folder above {run}")
        write_plotly_js(shared_plotly)
        plotly_dir = Path(os.path.relpath(shared_plotly.resolve(), run.resolve())).as_posix() + "/"
    with usage_errors():
        pages = write_reports(run, plotly_dir)
    for page in pages:
        console.print(f"report: {escape(str(page))}")


@app.command("publish")
def publish_command(
    reports: Path = typer.Argument(..., help="a reports tree: <gpu-model>/<run>/results.csv, or <gpu-model>/<run>/<entry>/results.csv"),
    out: Path = typer.Option(Path("site"), help="the site folder; an existing site is brought up to date"),
    jobs: Optional[int] = typer.Option(None, min=1, help="run folders rendered at once (default: one per CPU)"),
) -> None:
    """Build a static site of every run: per GPU model the latest runs, history charts, compare pages, reports."""
    from rich.progress import Progress

    from fp8bench.harness.validate import printable, usage_errors
    from fp8bench.publish.site import publish

    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:  # no bars in logs
        task = progress.add_task("publishing", total=None)

        def advance(done: int, total: int, what: str) -> None:
            progress.update(task, completed=done, total=total, description=escape(printable(what)))

        with usage_errors():
            published = publish(reports, out, advance, jobs)
    for skipped in published.skipped:
        console.print(f"[yellow]skipped[/] {escape(printable(str(skipped.path)))}: {escape(printable(skipped.reason))}")
    console.print(
        f"site: {escape(str(published.index))} ({len(published.rebuilt)} run folders and compare pages built, "
        f"{len(published.unchanged)} unchanged)"
    )


@app.command("run")
def run_suite(
    suite: Path = typer.Argument(..., help="a suite file, e.g. suites/square.toml"),
    out: Optional[Path] = typer.Option(None, help="folder for the suite's runs (default: the suite's `out`)"),
    parallel: bool = typer.Option(False, "--parallel/--sequential", help="one entry per GPU of this host at a time, each in its own process (log: <out>/<entry>.log)"),
    only: Optional[list[str]] = typer.Option(None, "--only", help="run only the entry of this name (repeatable)"),
    resume: bool = typer.Option(False, help="entries whose run folder holds results continue it (--resume)"),
) -> None:
    """Run every benchmark a suite file lists (or those named by --only), each into its own run folder."""
    import dataclasses

    from fp8bench.harness.suite import load_suite

    try:
        loaded = load_suite(suite)
    except (OSError, ValueError) as err:
        raise typer.BadParameter(str(err)) from None
    if only:
        names = [entry.name for entry in loaded.entries]
        unknown = [name for name in only if name not in names]
        if unknown:
            raise typer.BadParameter(f"no entry named {', '.join(unknown)} in {suite}; its entries: {', '.join(names)}")
        loaded = dataclasses.replace(loaded, entries=tuple(entry for entry in loaded.entries if entry.name in only))
    from fp8bench.harness.suite import detected_gpu_key

    base = out or Path(str(loaded.out).replace("{gpu}", detected_gpu_key()))
    if parallel:
        from fp8bench.harness.campaign import run_parallel, visible_gpus

        try:
            code = run_parallel(loaded, base, visible_gpus(), console.print, resume)
        except ValueError as err:
            raise EnvironmentProblem(str(err)) from None
        raise typer.Exit(code)
    for entry in loaded.entries:
        console.rule(f"{loaded.name}: {entry.name}")
        app(entry.argv(base, resume), standalone_mode=False)


# ---- compare / gate / baseline (fp8bench.gate.gate; statistics in fp8bench.gate.compare; docs/gating.md) ----
_METRIC_HELP = "speedup (FP8 vs BF16 in the same run) | time (absolute); default: the metric of the suite file's gate table, else speedup"
_INCONCLUSIVE_FLAG = "--fail-on-inconclusive/--no-fail-on-inconclusive"


def _outputs(markdown: Optional[Path], json_path: Optional[Path], junit: Optional[Path]):
    from fp8bench.gate.output import Outputs

    return Outputs(markdown, json_path, junit)


@app.command()
def compare(
    base: Path = typer.Argument(..., help="baseline: a run folder, a results CSV, or a folder of suite runs"),
    new: Path = typer.Argument(..., help="the run to judge, of the same kind as BASE"),
    metric: Optional[str] = typer.Option(None, help=_METRIC_HELP),
    suite: Optional[Path] = typer.Option(None, help="a suite file whose gate table sets the thresholds"),
    markdown: Optional[Path] = typer.Option(None, help="write a Markdown summary (e.g. for CI job summaries)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the comparison as JSON"),
    junit: Optional[Path] = typer.Option(None, help="write JUnit XML, one test case per benchmark case"),
    fail_on_inconclusive: Optional[bool] = typer.Option(None, _INCONCLUSIVE_FLAG, help="exit 3 on INCONCLUSIVE"),
) -> None:
    """Compare a run with a baseline. Exit 0 pass, 1 regression, 2 malformed input or usage error, 3 inconclusive (when asked), 4 other GPU model or environment, 5 incomplete."""
    from fp8bench.gate.gate import compare_trees, conclude, resolve_config

    def body():
        return compare_trees(base, new, resolve_config(suite, metric, fail_on_inconclusive))

    raise typer.Exit(conclude(body, _outputs(markdown, json_path, junit), console))


@app.command("gate")
def gate_command(
    suite: Path = typer.Option(..., help="the suite to run; its gate table sets the thresholds"),
    baseline: str = typer.Option(..., help="a baseline name (looked up under --baseline-dir/<gpu-model>/) or path"),
    baseline_dir: Path = typer.Option(Path("baselines"), help="where named baselines live"),
    out: Optional[Path] = typer.Option(None, help="folder for the new runs (default runs/<time>-gate-<suite>)"),
    runs: Optional[Path] = typer.Option(None, help="judge the suite runs already in this folder instead of running the suite"),
    rerun: bool = typer.Option(True, help="measure REGRESSION/INCONCLUSIVE cases once more before deciding them"),
    metric: Optional[str] = typer.Option(None, help=_METRIC_HELP),
    markdown: Optional[Path] = typer.Option(None, help="write a Markdown summary (e.g. for CI job summaries)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the comparison as JSON"),
    junit: Optional[Path] = typer.Option(None, help="write JUnit XML, one test case per benchmark case"),
    fail_on_inconclusive: Optional[bool] = typer.Option(None, _INCONCLUSIVE_FLAG, help="exit 3 on INCONCLUSIVE"),
) -> None:
    """Run a suite and compare it with a baseline, re-running flagged cases once. Exit codes as `compare`."""
    from fp8bench.gate.gate import conclude, gate, resolve_config
    from fp8bench.harness.env import gpu_metadata
    from fp8bench.harness.validate import UsageError

    device = None
    if runs is None or rerun:
        try:
            require_cuda("gate")
        except EnvironmentProblem as err:
            raise UsageError(f"{err} (to judge runs made elsewhere: --runs DIR --no-rerun)") from None
        device = gpu_metadata()

    def invoke(argv: list[str]) -> None:
        """One fp8bench command of the suite (or a re-run), in this process."""
        try:
            code = app(argv, standalone_mode=False)
        except typer.TyperException as err:  # a suite entry with a bad option
            raise UsageError(f"fp8bench {shlex.join(argv)}: {err.format_message()}") from None
        if code:  # e.g. 130: interrupted; the finished cases are in the run folder
            raise typer.Exit(code)

    def body():
        config = resolve_config(suite, metric, fail_on_inconclusive)
        run_dir = out or default_run_dir("gate", suite.stem)
        return gate(suite, baseline, baseline_dir, run_dir, config, device, invoke, runs, rerun, console, _remeasure)

    raise typer.Exit(conclude(body, _outputs(markdown, json_path, junit), console))


baseline_app = typer.Typer(help="Runs kept for `compare` and `gate`, keyed by GPU model.", **_HELP)
app.add_typer(baseline_app, name="baseline")


@baseline_app.command("save")
def baseline_save(
    run: Path = typer.Argument(..., help="a run folder, a results CSV, or a folder of suite runs"),
    name: str = typer.Option(..., help="the baseline's name, e.g. main"),
    root: Path = typer.Option(Path("baselines"), "--dir", help="baselines root; the run goes to <dir>/<gpu-model>/<name>/"),
    force: bool = typer.Option(False, help="replace an existing baseline of that name"),
) -> None:
    """Copy a run (results.csv + metadata.json) into the baselines folder of its GPU model."""
    from fp8bench.gate import baseline
    from fp8bench.harness.validate import usage_errors

    with usage_errors():
        saved = baseline.save(run, name, root, force)
    console.print(f"baseline {escape(repr(name))} saved to {escape(str(saved))}")


@app.command()
def roofline(
    shape_gen: str = typer.Option("square", help="square | pow2-extended | llama | training (every product of a LLaMa-3 8B training step) | sweep | dsv3 | awkward (moe, tp-shards, unaligned, small-m) | custom"),
    granularity: str = typer.Option("all", help="keep the recipes of: tensorwise | axiswise (alias rowwise) | blockwise | all"),
    recipe: Optional[list[str]] = typer.Option(None, help=_RECIPE_HELP),
    implementation: Optional[list[str]] = typer.Option(None, help="repeatable; triton | torchao | te | unfused | all (default)"),
    M: Optional[int] = typer.Option(None, "--M", help="with --shape-gen custom"),
    K: Optional[int] = typer.Option(None, "--K", help="with --shape-gen custom"),
    N: Optional[int] = typer.Option(None, "--N", help="with --shape-gen custom"),
    gpu: Optional[list[str]] = typer.Option(
        None, help="repeatable; GPU model whose ceilings to predict with: auto (detect, the default) or a hardware-table key; several side by side with --no-measure"
    ),
    calibration: Optional[Path] = typer.Option(None, help="a profile from `fp8bench calibrate` (default: the installed checkout's calibration/<gpu>.json if it exists)"),
    measure: bool = typer.Option(True, "--measure/--no-measure", help="also measure the layer (needs a GPU; predictions only without one)"),
    report: bool = typer.Option(True, "--report/--no-report", help="write the HTML report into the run folder"),
    shape_name: Optional[list[str]] = typer.Option(None, help="repeatable; keep the shapes whose name contains this (e.g. llama3-8b.)"),
    shape: Optional[list[str]] = typer.Option(None, "--shape", help="with --shape-gen custom: a product MxKxN, repeatable"),
    repeats: int = typer.Option(5, min=1, help="measured: independent repeats per case (each with its own warm-up)"),
    eager: bool = typer.Option(True, "--eager/--no-eager", help="measured: also our layer (Float8LayerNormLinear) and the BF16 layer without torch.compile"),
    out: Optional[Path] = typer.Option(None, help="run folder (default runs/<time>-roofline-<shape-gen>)"),
    resume: bool = typer.Option(
        False, help="continue the measured run in --out with the same options: its finished shapes are kept, the rest measured"
    ),
) -> None:
    """LayerNorm -> Linear -> sigmoid, fwd + bwd: predicted FP8 speedup per recipe and implementation, and
    on a GPU the measured step of BF16, ours, torchao and TransformerEngine beside it (fp8bench.benchmarks.layer)."""
    _resume_needs_out(resume, out)
    from fp8bench.model.roofline import IMPLEMENTATION_CHOICES, calibrated_ceilings, spec_ceilings
    from fp8bench.benchmarks.roofline import KERNELS_CSV, RooflineConfig, print_tables, run_roofline
    from fp8bench.benchmarks import shapes
    from fp8bench.harness.results import MODEL_BACKEND
    from fp8bench.model.calibration import default_profile_path, load_profile
    from fp8bench.harness.env import cuda_device_name, run_metadata
    from fp8bench.model.hardware import resolve_gpu, spec_for_device_name
    from fp8bench.nn.recipes import RECIPE_CHOICES
    granularities = choice(granularity, GRANULARITY_CHOICES, "granularity")
    recipes = [r for name in recipe or ["all"] for r in choice(name, RECIPE_CHOICES, "recipe")]
    recipes = [r for r in dict.fromkeys(recipes) if r.granularity in granularities]
    if not recipes:
        raise typer.BadParameter(f"no chosen recipe scales with granularity {granularity!r}")
    impls = tuple(dict.fromkeys(i for name in implementation or ["all"] for i in choice(name, IMPLEMENTATION_CHOICES, "implementation")))
    device_name = cuda_device_name()
    try:
        shape_list = shapes.generate(shape_gen, M, K, N, shape_name or (), shape or ())
        specs = list(dict.fromkeys(resolve_gpu(name, device_name) for name in gpu or ["auto"]))
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if calibration is not None and len(specs) > 1:
        raise typer.BadParameter("--calibration is one GPU's profile; with several --gpu each uses its own calibration/<gpu>.json")
    measuring = measure and device_name is not None
    if measuring and (len(specs) > 1 or spec_for_device_name(device_name) is not specs[0]):
        names = ", ".join(s.key for s in specs)
        raise typer.BadParameter(f"--gpu {names} is not just this {device_name}; add --no-measure to predict for it")
    spec = specs[0]
    ceilings = []
    for each in specs:
        of_gpu = [spec_ceilings(each)]
        profile_path = calibration or default_profile_path(each.key)
        if calibration is not None or profile_path.exists():
            try:
                profile = load_profile(profile_path)
            except ValueError as err:
                raise typer.BadParameter(str(err)) from None
            if profile.gpu_key != each.key:
                raise typer.BadParameter(f"{profile_path} was measured on {profile.gpu_key}, not {each.key}")
            of_gpu.append(calibrated_ceilings(profile, profile_path))
        # several GPU models side by side: each set of ceilings is named after its GPU
        ceilings += [dataclasses.replace(c, source=f"{each.key} {c.source}") for c in of_gpu] if len(specs) > 1 else of_gpu
    config = RooflineConfig(tuple(shape_list), tuple(recipes), impls, tuple(ceilings))

    layer_config = None
    if measuring:
        from fp8bench.benchmarks.layer import MEASURED_IMPLEMENTATIONS, LayerConfig

        measured = tuple(i.name for i in impls if i.name in MEASURED_IMPLEMENTATIONS)
        layer_config = LayerConfig(tuple(shape_list), tuple(recipes), measured, TimingConfig(repeats=repeats), eager)
    elif measure:
        err_console.print("[yellow]predictions only: no CUDA GPU here[/]")
    if resume and not layer_config:
        raise typer.BadParameter("--resume continues a measured run; it needs a CUDA GPU and --measure")
    run_dir = out or default_run_dir("roofline", shape_gen)
    extra = {"benchmark": "roofline", "gpu_spec": spec.key, "prediction_only": not measuring, "ceilings": {c.source: c.label for c in ceilings}}
    if len(specs) > 1:
        extra["gpu_specs"] = [s.key for s in specs]
    benchmark = cases = None
    if layer_config:
        from fp8bench.benchmarks.layer import LayerBenchmark
        from fp8bench.harness.timing import CuptiTimer, GpuClock, OneTimer

        extra["timing"] = dataclasses.asdict(layer_config.timing)
        benchmark = LayerBenchmark(layer_config, ceilings[-1], CuptiTimer(GpuClock()), run_dir)
        cases = benchmark.cases()
        if _planned(benchmark, OneTimer(benchmark.timer), layer_config.timing):
            return
    if resume:  # the first call wrote every shape's predictions: they stay
        left, extra["resumed_from"] = _resumed(cases, out, keep=lambda row: row["backend"] == MODEL_BACKEND)
        benchmark.resume_kernels({c.case.shape.name for c in cases} - {c.case.shape.name for c in left})
        cases = left
    with _open_run(run_dir, run_metadata(command_line(), extra), resume) as writer:
        if resume:
            console.print(f"predictions: kept from the first call in {writer.csv_path}")
        else:
            layers = run_roofline(config, writer)
            print_tables(console, config, layers)
            console.print(f"predictions -> {writer.csv_path} (kernels: {run_dir / KERNELS_CSV})")
        if benchmark:
            _measure_layer(benchmark, cases, writer)
    if report:
        _write_pages(run_dir)


def _measure_layer(benchmark, cases: list, writer) -> None:
    """The measured half of `roofline` (fp8bench.benchmarks.layer) through the harness; Ctrl-C keeps the
    finished rows."""
    from fp8bench.benchmarks import layer
    from fp8bench.harness.runner import run_cases
    from fp8bench.harness.timing import OneTimer

    try:
        rows = run_cases(benchmark, cases, writer, OneTimer(benchmark.timer), benchmark.config.timing,
                         lambda row: console.print(layer.row_line(row)))  # fmt: skip
    except KeyboardInterrupt:
        err_console.print(f"[yellow]interrupted: the finished cases are in {writer.csv_path}[/]")
        raise typer.Exit(130) from None
    layer.print_rows(console, rows)
    console.print(f"measured -> {writer.csv_path} (kernels: {writer.run_dir / layer.KERNELS_CSV})")


@app.command()
def e2e(
    ctx: typer.Context,
    model: str = typer.Option("llama3-8b", help="llama3-8b | llama3-70b | llama3-405b | custom (with --dim, --ffn-dim, --heads, --kv-heads, --vocab)"),
    layers: int = typer.Option(4, min=1, help="transformer blocks: a proxy of the model's width (the full 8B has 32)"),
    dim: Optional[int] = typer.Option(None, min=1, help="with --model custom: model width"),
    ffn_dim: Optional[int] = typer.Option(None, min=1, help="with --model custom: SwiGLU hidden width"),
    heads: Optional[int] = typer.Option(None, min=1, help="with --model custom: query heads"),
    kv_heads: Optional[int] = typer.Option(None, min=1, help="with --model custom: key/value heads"),
    vocab: Optional[int] = typer.Option(None, min=1, help="with --model custom: vocabulary size"),
    seq_len: int = typer.Option(8192, min=1, help="tokens per sequence"),
    batch: int = typer.Option(1, min=1, help="sequences per step per GPU"),
    steps: int = typer.Option(10, min=2, help="measured training steps"),
    warmup: int = typer.Option(3, min=1, help="training steps before the measured ones (compilation, autotuning)"),
    recipe: Optional[list[str]] = typer.Option(None, help=_RECIPE_HELP),
    implementation: Optional[list[str]] = typer.Option(None, help="repeatable; bf16 | triton (ours) | torchao | te | te-layer (TE's TransformerLayer, also in BF16) | all (default); BF16 always runs as the reference"),
    compile: str = typer.Option("block", "--compile", help="torch.compile: none | block | model, and the loss with either (BF16 also runs eagerly)"),
    activation_checkpointing: str = typer.Option(
        "none", help="none | selective (products, attention and amaxes kept, the rest recomputed: torchtitan's per-op policy; with TE, the parts between its linears) | selective-casts (the FP8 casts kept too, as TE's linears keep theirs) | full, per block"
    ),
    lm_head: str = typer.Option("bf16", help="bf16 | fp8: the LM head's products"),
    attention: str = typer.Option(
        "flash", help="scaled_dot_product_attention backend for every row: flash | cudnn | efficient | math | auto (torch's choice: cuDNN on an H100 with torch 2.11)"
    ),
    nproc_per_node: int = typer.Option(1, min=1, help="GPUs of this host to train on with FSDP2 (launched with torchrun)"),
    one_gpu_baseline: bool = typer.Option(
        False, "--one-gpu-baseline", help="with --nproc-per-node N: first the same cases on one GPU, in the same run, for the report's scaling efficiency"
    ),
    baseline_gpus: int = typer.Option(
        0, min=0, help="with --nproc-per-node N: first the same cases on the first K of its GPUs (0 < K < N), in the same run, for the report's scaling efficiency from K GPUs to N (--one-gpu-baseline is K = 1)"
    ),
    reshard_after_forward: str = typer.Option(
        "default", help="FSDP2, per block: default (each block frees its gathered weights after its forward, the last one after its backward) | never (every block keeps them until its backward: no all-gather in the backward, the unsharded weights' memory)"
    ),
    out: Optional[Path] = typer.Option(None, help="run folder (default runs/<time>-e2e-<model>)"),
    resume: bool = typer.Option(
        False, help="continue the run in --out with the same options: its finished groups are kept, the rest measured"
    ),
    trace: bool = typer.Option(
        False, help="also trace one more step of each case on every rank (torch.profiler: host ops, kernels, launches) into <out>/traces as Chrome traces"
    ),
) -> None:
    """Training throughput of a LLaMa-3 model or proxy: BF16 eager and compiled against ours, torchao and
    TransformerEngine per recipe, on one GPU or several with FSDP2 (fp8bench.benchmarks.e2e)."""
    _resume_needs_out(resume, out)
    from fp8bench.benchmarks.e2e import (
        CUSTOM, IMPLEMENTATIONS, MODEL_CHOICES, E2EConfig, custom_model, gpu_benchmark, launches, run_command,
    )
    from fp8bench.nn.llama import PRESETS
    from fp8bench.nn.recipes import RECIPE_CHOICES

    if model not in MODEL_CHOICES:
        raise typer.BadParameter(f"unknown model {model!r}; choose one of: {', '.join(MODEL_CHOICES)}")
    recipes = tuple(dict.fromkeys(r for name in recipe or ["all"] for r in choice(name, RECIPE_CHOICES, "recipe")))
    impl_choices = {**{name: (name,) for name in IMPLEMENTATIONS}, "all": IMPLEMENTATIONS}
    impls = tuple(dict.fromkeys(i for name in implementation or ["all"] for i in choice(name, impl_choices, "implementation")))
    distributed = "LOCAL_RANK" in os.environ  # a rank that torchrun started
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if distributed else nproc_per_node
    if one_gpu_baseline and nproc_per_node < 2:
        raise typer.BadParameter("--one-gpu-baseline measures a run on several GPUs against one: give --nproc-per-node 2 or more")
    if baseline_gpus and not baseline_gpus < nproc_per_node:
        raise typer.BadParameter(f"--baseline-gpus {baseline_gpus} measures a run on --nproc-per-node GPUs against fewer: "
                                 f"give --nproc-per-node more than {baseline_gpus}")
    if one_gpu_baseline and baseline_gpus > 1:
        raise typer.BadParameter("--one-gpu-baseline is --baseline-gpus 1: give one of the two")
    try:
        if model == CUSTOM:
            dims = (dim, ffn_dim, heads, kv_heads, vocab)
            if None in dims:
                raise ValueError("--model custom needs --dim, --ffn-dim, --heads, --kv-heads and --vocab")
            architecture = custom_model(*dims, layers)
        else:
            architecture = PRESETS[model].with_layers(layers)
        config = E2EConfig(
            architecture, recipes, tuple(i for i in impls if i != "bf16"), seq_len, batch, steps, warmup, compile.strip().lower(),
            activation_checkpointing.strip().lower(), lm_head.strip().lower(), world_size, attention.strip().lower(), trace,
            reshard_after_forward.strip().lower(),
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    device_name = require_cuda("e2e")
    run_dir = out or default_run_dir("e2e", architecture.name)
    if _PLANNING.get() is not None:  # the gate's re-run of a case: in this process, on this GPU
        _planned(gpu_benchmark(config, run_dir, device_name), None, TimingConfig())
        return
    if nproc_per_node > 1 and not distributed:  # every rank runs this command again, under torchrun
        import subprocess

        import torch

        if torch.cuda.device_count() < nproc_per_node:
            raise EnvironmentProblem(f"--nproc-per-node {nproc_per_node} but this host shows {torch.cuda.device_count()} CUDA GPUs")
        # From the options as parsed: a suite runs commands in-process, so sys.argv may be another command's.
        for command, environment in launches(ctx.params, run_dir, os.environ):
            returncode = subprocess.run(command, env=environment).returncode
            if returncode:
                raise typer.Exit(returncode)
        raise typer.Exit(0)
    if distributed and world_size != nproc_per_node:
        raise typer.BadParameter(f"torchrun started {world_size} ranks but --nproc-per-node is {nproc_per_node}")
    try:
        resumed = (lambda cases: _resumed(cases, out, config.kept_on_resume)) if resume else None
        run_command(config, run_dir, device_name, command_line(), distributed, resumed, _open_run, console.print, err_console.print)
    except KeyboardInterrupt:
        err_console.print(f"[yellow]interrupted: the finished cases are in {run_dir / 'results.csv'}[/]")
        raise typer.Exit(130) from None


@app.command()
def calibrate(
    out: Optional[Path] = typer.Option(None, help="profile file (default calibration/<gpu>.json)"),
    gpu: str = typer.Option("auto", help="hardware-table key the profile is for: auto (detect) or a key"),
    repeats: int = typer.Option(5, min=1, help="independent repeats per measurement"),
    run_out: Optional[Path] = typer.Option(None, help="run folder for the measurements (default runs/<time>-calibrate-<gpu>)"),
) -> None:
    """Measure this GPU's achievable GEMM TFLOPS, copy bandwidth and launch floor for the roofline."""
    from fp8bench.benchmarks.calibrate import CalibrationBenchmark, profile_from_rows
    from fp8bench.harness.env import run_metadata
    from fp8bench.harness.runner import run_cases
    from fp8bench.harness.timing import TimerChoice
    from fp8bench.model.calibration import REQUIRED_FP8, default_profile_path, save_profile
    from fp8bench.model.hardware import gpu_choices, resolve_gpu

    if gpu not in gpu_choices():
        raise typer.BadParameter(f"unknown GPU {gpu!r}; choose one of: {', '.join(gpu_choices())}")
    device_name = require_cuda("calibrate")
    try:
        spec = resolve_gpu(gpu, device_name)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    console.print(f"[bold]calibrate[/] {device_name} as {spec.key}")
    timing = TimingConfig(repeats=repeats)
    benchmark = CalibrationBenchmark()
    metadata = run_metadata(command_line(), {"benchmark": benchmark.name, "gpu_spec": spec.key, "timing": dataclasses.asdict(timing)})
    with _open_run(run_out or default_run_dir(benchmark.name, spec.key), metadata, resume=False) as writer:
        rows = run_cases(benchmark, benchmark.cases(), writer, TimerChoice("auto", timing.flush_l2), timing)
    console.print(f"measurements -> {writer.csv_path}")
    try:
        profile = profile_from_rows([row.values for row in rows], spec.key, device_name, benchmark.shapes, metadata, console.print)
    except ValueError as err:
        raise EnvironmentProblem(str(err)) from None
    path = save_profile(profile, out or default_profile_path(spec.key))
    console.print(
        f"BF16 {100 * profile.bf16_tflops / spec.bf16_tflops:.0f}% and FP8 tensorwise "
        f"{100 * profile.fp8_tflops[REQUIRED_FP8] / spec.fp8_tflops:.0f}% of dense peak; copy "
        f"{100 * profile.copy_tbps / spec.mem_bw_tbps:.0f}% of {spec.mem_bw_tbps} TB/s -> {path}"
    )


# ---- numerics: loss curves, tensor statistics, start-up, FP8 optimizer states (fp8bench.benchmarks.numerics) ----
class _NumericsGroup(_HelpGroup):
    """The numerics commands, whose --model help lists fp8bench.benchmarks.numerics.MODELS: read when a
    command is resolved (its help or its run), so that the rest of the CLI starts without torch."""

    def get_command(self, ctx, name):
        command = super().get_command(ctx, name)
        for param in getattr(command, "params", ()):
            if param.name == "model":
                from fp8bench.benchmarks.numerics import MODELS

                param.help = f"the model to train: {' | '.join(MODELS)}"
        return command


numerics_app = typer.Typer(help="What FP8 costs in training quality: loss curves on real text against BF16, tensor statistics, delayed-scaling start-up, FP8 optimizer states.",
                           **{**_HELP, "cls": _NumericsGroup})  # fmt: skip
app.add_typer(numerics_app, name="numerics")


def _numerics_setup(command: str, model: str, steps: int, batch_size: int, seq_len: int, lr: float, eval_every: int,
                    corpus_bytes: Optional[int], out: Optional[Path], extra: dict, lr_schedule: str = "constant", resume: bool = False):  # fmt: skip
    """The model factory, the training config, the corpus and an open RunWriter (with the corpus's and
    the config's metadata) of a numerics command; `resume` continues the run in `out`, which must have
    been made with the same training config."""
    import torch

    from fp8bench.benchmarks import numerics
    from fp8bench.harness.env import run_metadata
    from fp8bench.harness.results import RunWriter
    from fp8bench.nn.text_data import load_stdlib_corpus

    factory = choice(model, {name: (f,) for name, f in numerics.MODELS.items()}, "model")[0]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        schedule = choice(lr_schedule, numerics.LR_SCHEDULE_CHOICES, "learning-rate schedule")[0]
        config = numerics.TrainConfig(steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, eval_every=min(eval_every, steps),
                                      lr_schedule=schedule, corpus_bytes=corpus_bytes, device=device)  # fmt: skip
        corpus = load_stdlib_corpus(corpus_bytes)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    run_dir = out or default_run_dir("numerics", f"{command}-{model}")
    metadata = run_metadata(command_line(), {"benchmark": "numerics", "experiment": command, "model": model, "device": device,
                                             "train": dataclasses.asdict(config), "corpus": corpus.metadata(), **extra})  # fmt: skip
    if resume:
        _same_training(run_dir, metadata)
    console.print(f"[bold]numerics {command}[/] {model} on {device} ({metadata.get('gpu_name') or 'no GPU'}) -> {run_dir}")
    return factory, config, corpus, _open_run(run_dir, metadata, resume)


def _same_training(run_dir: Path, metadata: dict) -> None:
    """A usage error unless the numerics run in `run_dir` trained as `metadata` says: its curves would not
    be comparable with the new ones."""
    import json

    from fp8bench.harness.results import read_metadata

    _require_results(run_dir)
    before = read_metadata(run_dir)
    for key in ("experiment", "model", "train", "corpus"):
        if json.dumps(before.get(key), sort_keys=True) != json.dumps(metadata[key], sort_keys=True, default=str):
            raise typer.BadParameter(f"--resume: {run_dir} was run with another {key} ({before.get(key)}); give the same options")


def _print_curve(result) -> None:
    losses = result.losses
    last = f"last loss {losses[-1]:.4f}" if losses else ""
    console.print(f"  {result.curve.name:28} {result.status:10} {last}")


ESTIMATE_AFTER_STEPS = 20  # a curve's time is estimated (and printed, for logs) once this many steps ran


@contextlib.contextmanager
def _curve_progress(steps: int):
    """A progress bar per curve with its elapsed time and the time its remaining steps will take at the
    rate so far, and one printed line per curve with its estimated total (a log has no live bar); yields
    the step callback of the numerics runs."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = (TextColumn("  {task.description:28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("left about"), TimeRemainingColumn())
    tasks: dict[str, object] = {}
    with Progress(*columns, console=console) as progress:

        def on_step(curve, step: int, loss: float) -> None:
            if curve.name not in tasks:
                tasks[curve.name] = progress.add_task(curve.name, total=steps)
            progress.update(tasks[curve.name], completed=step)
            if step == min(ESTIMATE_AFTER_STEPS, steps):
                elapsed = next(task.elapsed for task in progress.tasks if task.id == tasks[curve.name]) or 0.0
                progress.console.print(f"  {curve.name:28} about {elapsed / step * steps:.0f} s for {steps} steps at the rate of its first {step}")

        yield on_step


def _numerics_recipes(recipe: Optional[list[str]]):
    from fp8bench.nn.recipes import RECIPE_CHOICES

    return tuple(dict.fromkeys(r for name in recipe or ["all"] for r in choice(name, RECIPE_CHOICES, "recipe")))


def _numerics_loss(command: str, model, recipe, implementation, steps, batch_size, seq_len, lr, lr_schedule, eval_every, bf16_seeds, seeds,
                   corpus_bytes, out, stats, jobs=1, resume=False) -> None:  # fmt: skip
    from fp8bench.benchmarks import numerics
    from fp8bench.harness.curves import bf16_noise, seed_gaps

    _resume_needs_out(resume, out)
    recipes = _numerics_recipes(recipe)
    implementations = tuple(dict.fromkeys(choice(name, {i: (i,) for i in numerics.IMPLEMENTATIONS}, "implementation")[0]
                                          for name in implementation or ["triton"]))  # fmt: skip
    curves = numerics.loss_curves(recipes, tuple(range(bf16_seeds)), implementations, tuple(range(seeds)))
    factory, config, corpus, writer = _numerics_setup(command, model, steps, batch_size, seq_len, lr, eval_every, corpus_bytes, out,
                                                      {"implementations": list(implementations), "seeds": seeds, "jobs": jobs},
                                                      lr_schedule, resume)  # fmt: skip
    console.print(f"  {len(curves)} curves of {steps} steps, {jobs} at a time, learning rate {config.lr_schedule.value} after the warm-up")
    with writer, _curve_progress(steps) as on_step:
        results = numerics.run_loss(factory, model, curves, config, corpus, writer, collect_stats=stats, on_curve=_print_curve, on_step=on_step,
                                    jobs=jobs)  # fmt: skip
    losses = {result.curve.name: result.losses for result in results if result.losses}
    bf16 = [losses[c.name] for c in curves if c.recipe is None and c.name in losses]
    noise = bf16_noise(bf16)
    shown = "n/a (one seed)" if math.isnan(noise) else f"{noise:.2%} (standard deviation)"
    console.print(f"  BF16 run-to-run noise of the loss over the last 10% of steps, over {len(bf16)} seeds: {shown}")
    console.print("  loss gap to BF16 with the same seed over the last 10% of steps, mean over seeds:")
    for (implementation_name, recipe_name), members in _by_recipe(curves).items():
        pairs = [(losses[c.name], losses[numerics.bf16_curve_name(c.seed)]) for c in members
                 if c.name in losses and numerics.bf16_curve_name(c.seed) in losses]  # fmt: skip
        if pairs:
            console.print(f"  {implementation_name + ' ' + recipe_name:32} {seed_gaps(pairs, bf16).describe()}")


def _by_recipe(curves: list) -> dict[tuple[str, str], list]:
    """The FP8 curves per (implementation, recipe), their seeds in order."""
    groups: dict[tuple[str, str], list] = {}
    for curve in curves:
        if curve.recipe is not None:
            groups.setdefault((curve.implementation, curve.recipe.name), []).append(curve)
    return groups


_IMPLEMENTATION_HELP = ("repeatable; converts the model for each FP8 recipe: triton (ours, default) | torchao | te; a recipe an "
                        "implementation lacks is an unsupported row")  # fmt: skip
# Options every numerics command takes, declared once.
_MODEL_OPTION = typer.Option("llama-25m", help="the model to train")  # the choices: _NumericsGroup
_BATCH_SIZE_OPTION = typer.Option(16, min=1, help="sequences per step")
_SEQ_LEN_OPTION = typer.Option(256, min=1, help="tokens (bytes) per sequence")
_LR_OPTION = typer.Option(1e-3, help="peak learning rate, reached after a linear warm-up of 50 steps (startup: constant after it)")
_LR_SCHEDULE_OPTION = typer.Option("cosine", help="the learning rate after the warm-up: cosine (down to 10% of the peak at the last step) | "
                                   "constant; with cosine the end-of-run loss the gaps compare varies 3.6x less from seed to seed "
                                   "(llama-25m, 1000 steps, 4 BF16 seeds: 0.44% against 1.59%)")  # fmt: skip
_CORPUS_BYTES_OPTION = typer.Option(None, help="use only the first files of the corpus up to this many bytes")
_OUT_OPTION = typer.Option(None, help="run folder (default runs/<time>-numerics-<command>-<model>)")
_JOBS_OPTION = typer.Option(None, min=1, help="curves trained at once, each in a fresh worker process on the one GPU (1: one after the other "
                            "in this process; default 4 on a GPU, 1 on the CPU); the curves measure losses, not speed, so running them side "
                            "by side changes no number")  # fmt: skip


def _default_jobs(jobs: Optional[int]) -> int:
    """--jobs, or its default: numerics.GPU_JOBS on a GPU, 1 on the CPU."""
    if jobs is not None:
        return jobs
    import torch

    from fp8bench.benchmarks.numerics import GPU_JOBS

    return GPU_JOBS if torch.cuda.is_available() else 1


@numerics_app.command("loss")
def numerics_loss(
    model: str = _MODEL_OPTION,
    recipe: Optional[list[str]] = typer.Option(None, help=_RECIPE_HELP),
    implementation: Optional[list[str]] = typer.Option(None, help=_IMPLEMENTATION_HELP),
    steps: int = typer.Option(1000, min=1),
    batch_size: int = _BATCH_SIZE_OPTION,
    seq_len: int = _SEQ_LEN_OPTION,
    lr: float = _LR_OPTION,
    lr_schedule: str = _LR_SCHEDULE_OPTION,
    eval_every: int = typer.Option(100, min=1, help="validation loss every this many steps (and at the end)"),
    seeds: int = typer.Option(1, min=0, help="each FP8 curve with seeds 0..N-1, and BF16 with as many at least (the seed sets the initial "
                              "weights; the batches stay the same): a recipe's gap is its mean over the seeds, each to BF16 with the same "
                              "seed; 0: BF16 only"),
    bf16_seeds: int = typer.Option(2, min=1, help="BF16 with at least this many seeds (their spread is the run-to-run noise)"),
    jobs: Optional[int] = _JOBS_OPTION,
    resume: bool = typer.Option(False, help="continue the run in --out: the curves it finished are kept, the others trained"),
    corpus_bytes: Optional[int] = _CORPUS_BYTES_OPTION,
    out: Optional[Path] = _OUT_OPTION,
) -> None:
    """Loss curves on the standard library's sources: BF16 (several seeds) and each FP8 recipe per implementation, the gap over the last 10% of steps."""
    _numerics_loss("loss", model, recipe, implementation, steps, batch_size, seq_len, lr, lr_schedule, eval_every, bf16_seeds, seeds, corpus_bytes,
                   out, stats=False, jobs=_default_jobs(jobs), resume=resume)  # fmt: skip


@numerics_app.command("stats")
def numerics_stats(
    model: str = _MODEL_OPTION,
    recipe: Optional[list[str]] = typer.Option(None, help=_RECIPE_HELP),
    implementation: Optional[list[str]] = typer.Option(None, help=_IMPLEMENTATION_HELP + "; statistics are taken of ours"),
    steps: int = typer.Option(200, min=1),
    batch_size: int = _BATCH_SIZE_OPTION,
    seq_len: int = _SEQ_LEN_OPTION,
    lr: float = _LR_OPTION,
    lr_schedule: str = _LR_SCHEDULE_OPTION,
    eval_every: int = typer.Option(100, min=1),
    corpus_bytes: Optional[int] = _CORPUS_BYTES_OPTION,
    out: Optional[Path] = _OUT_OPTION,
) -> None:
    """Loss curves with tensor statistics per layer and role: underflow, saturation, amax, scale, SQNR of each output."""
    _numerics_loss("stats", model, recipe, implementation, steps, batch_size, seq_len, lr, lr_schedule, eval_every, 1, 1, corpus_bytes, out, stats=True)


@numerics_app.command("startup")
def numerics_startup(
    model: str = _MODEL_OPTION,
    recipe: str = typer.Option("tensorwise-delayed", help="a recipe with delayed scaling"),
    steps: int = typer.Option(50, min=1),
    batch_size: int = _BATCH_SIZE_OPTION,
    seq_len: int = _SEQ_LEN_OPTION,
    lr: float = _LR_OPTION,
    corpus_bytes: Optional[int] = _CORPUS_BYTES_OPTION,
    out: Optional[Path] = _OUT_OPTION,
) -> None:
    """Delayed scaling's first scale (1 against calibrated) and master weights from FP8 against high-precision values: ours, and TransformerEngine's fp8_model_init(preserve_high_precision_init_val=True) where installed."""
    from fp8bench.benchmarks import numerics
    from fp8bench.nn.recipes import get_recipe

    try:
        chosen = get_recipe(recipe)
        numerics.startup_curves(chosen)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    factory, config, corpus, writer = _numerics_setup("startup", model, steps, batch_size, seq_len, lr, steps, corpus_bytes, out, {})
    with writer, _curve_progress(steps) as on_step:
        numerics.run_startup(factory, model, config, corpus, writer, chosen, on_curve=_print_curve, on_step=on_step)


@numerics_app.command("optimizer")
def numerics_optimizer(
    model: str = _MODEL_OPTION,
    loss_steps: int = typer.Option(1000, min=0, help="steps of the loss curve per optimizer (0: none)"),
    error_steps: int = typer.Option(20, min=1, help="steps of the update-error comparison"),
    batch_size: int = _BATCH_SIZE_OPTION,
    seq_len: int = _SEQ_LEN_OPTION,
    lr: float = _LR_OPTION,
    lr_schedule: str = _LR_SCHEDULE_OPTION,
    repeats: int = typer.Option(5, min=1, help="GPU timing: independent repeats per optimizer"),
    seeds: int = typer.Option(1, min=1, help="each optimizer's loss curve with seeds 0..N-1: a format's gap is its mean over the seeds, "
                              "each to FP32 AdamW with the same seed, and the FP32 seeds' spread is the noise"),
    jobs: Optional[int] = _JOBS_OPTION,
    corpus_bytes: Optional[int] = _CORPUS_BYTES_OPTION,
    out: Optional[Path] = _OUT_OPTION,
) -> None:
    """FP8 optimizer states against FP32: memory, update error, loss curve, and on a GPU the fused update against torch's fused AdamW."""
    from fp8bench.benchmarks import numerics

    factory, config, corpus, writer = _numerics_setup("optimizer", model, max(loss_steps, 1), batch_size, seq_len, lr, 100, corpus_bytes, out,
                                                      {"timing": dataclasses.asdict(TimingConfig(repeats=repeats))}, lr_schedule)  # fmt: skip
    timer = None
    if config.device == "cuda":
        from fp8bench.harness.timing import CudaEventTimer, GpuClock

        timer = CudaEventTimer(GpuClock())
    else:
        err_console.print("[yellow]no CUDA GPU: the update is not timed[/]")
    with writer:
        summary = numerics.run_optimizer(factory, model, config, corpus, writer, loss_steps, error_steps, timer, TimingConfig(repeats=repeats),
                                         on_curve=_print_curve, jobs=_default_jobs(jobs), seeds=seeds)  # fmt: skip
    for key, value in summary.items():
        console.print(f"  {key}: {value:.4g}" if isinstance(value, float) else f"  {key}: {value}")


@numerics_app.command("compare-loss")
def numerics_compare_loss(
    base: Path = typer.Argument(..., help="the reference: a `numerics loss` run folder, or its curves file (curves.csv.gz, or an older run's plain curves.csv)"),
    new: Path = typer.Argument(..., help="the run to judge, made by the same command"),
    rtol: float = typer.Option(0.01, min=0.0, help="largest relative difference of the mean loss at any checkpoint, either way"),
) -> None:
    """Gate a loss run on a stored reference: per curve the mean loss over the last 10% of the steps up to 25, 50, 75
    and 100% of the run, within --rtol. Exit 0 pass, 1 beyond, 2 malformed or missing file, 5 a curve missing."""
    from fp8bench.gate.compare import ExitCode
    from fp8bench.harness.curves import compare_loss
    from fp8bench.harness.validate import printable

    comparison = compare_loss(base, new, rtol)
    for point in comparison.checkpoints:
        verdict = "ok" if point.within(rtol) else "[red]BEYOND[/]"
        console.print(f"  {escape(printable(point.curve)):28} {point.fraction:4.0%} step {point.step:5}  reference {point.base_loss:.4f}  "
                      f"new {point.new_loss:.4f}  {point.gap:+.2%}  {verdict}", highlight=False)  # fmt: skip
    for curve in comparison.missing:
        console.print(f"  {escape(printable(curve)):28} [red]missing[/] from {escape(str(new))}", highlight=False)
    if comparison.failed:
        console.print(f"[red]FAIL[/]: {len(comparison.failed)} of {len(comparison.checkpoints)} checkpoints beyond {rtol:.2%}")
        raise typer.Exit(int(ExitCode.REGRESSION))
    if comparison.missing:
        console.print(f"[red]INCOMPLETE[/]: {len(comparison.missing)} of the reference's curves missing")
        raise typer.Exit(int(ExitCode.INCOMPLETE))
    console.print(f"PASS: {len(comparison.checkpoints)} checkpoints within {rtol:.2%}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
