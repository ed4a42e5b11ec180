"""The `fp8bench` command line (Typer). Each command parses its options into fp8bench.config objects
once, then hands them to the module that does the work."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer
import typer.core
from rich.console import Console
from rich.markup import escape

from fp8bench.config import FAST_ACCUM_CHOICES, GRANULARITY_CHOICES, MatmulConfig, TimingConfig, parse_choice

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


class _Commands(typer.core.TyperGroup):
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


app = typer.Typer(
    cls=_Commands,
    help="Benchmarks and roofline analysis for FP8 training on NVIDIA Hopper GPUs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


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
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{benchmark}-{label}"


def command_line() -> str:
    return shlex.join(["fp8bench", *sys.argv[1:]])


@app.command()
def matmul(
    shape_gen: str = typer.Option("square", help="square | pow2-extended | llama | sweep | dsv3 | custom"),
    granularity: str = typer.Option("all", help="tensorwise | axiswise (alias rowwise) | blockwise | all"),
    backend: Optional[list[str]] = typer.Option(None, help="repeatable; default: every available backend"),
    fast_accum: str = typer.Option("both", help="on | off | both"),
    M: Optional[int] = typer.Option(None, "--M", help="with --shape-gen custom"),
    K: Optional[int] = typer.Option(None, "--K", help="with --shape-gen custom"),
    N: Optional[int] = typer.Option(None, "--N", help="with --shape-gen custom"),
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
    from fp8bench.benchmarks import shapes
    from fp8bench.backends import REGISTRY, backend_names
    from fp8bench.model.hardware import resolve_gpu
    from fp8bench.harness.timing import TIMER_CHOICES

    granularities = choice(granularity, GRANULARITY_CHOICES, "granularity")
    fast_accums = choice(fast_accum, FAST_ACCUM_CHOICES, "fast-accum setting")
    if timer not in TIMER_CHOICES:
        raise typer.BadParameter(f"unknown timer {timer!r}; choose one of: {', '.join(TIMER_CHOICES)}")
    try:
        shape_list = shapes.generate(shape_gen, M, K, N)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    backends = tuple(backend or backend_names())
    unknown = [name for name in backends if name not in REGISTRY]
    if unknown:
        raise typer.BadParameter(f"unknown backend {unknown[0]!r}; choose from: {', '.join(REGISTRY)}")
    config = MatmulConfig(tuple(shape_list), granularities, backends, fast_accums, TimingConfig(repeats=repeats))
    device_name = require_cuda("matmul")
    resumed_from = None
    if resume:
        config, resumed_from = _resume(config, out)
    try:
        spec = resolve_gpu(gpu, device_name)
    except ValueError as err:
        if gpu != "auto":
            raise typer.BadParameter(str(err)) from None
        err_console.print(f"[yellow]{err}; % of peak is left empty[/]")
        spec = None
    from fp8bench.benchmarks.matmul import run_matmul

    body = lambda writer, on_row: run_matmul(config, writer, spec, timer, on_row)  # noqa: E731
    _run_benchmark("matmul", shape_gen, out, report, body, spec, config.timing, resumed_from=resumed_from)


MATMUL_ROW_KEY = ("case", "backend", "granularity", "fast_accum")


def _resume(config, out: Optional[Path]) -> tuple:
    """`config` narrowed to the shapes the run in `out` has not finished (a shape's BF16 reference and FP8
    cases are measured together, so a half-done shape is measured again, its rows dropped), and the earlier
    run's metadata for the new one to carry."""
    from fp8bench.benchmarks.matmul import expected_rows
    from fp8bench.harness.results import read_metadata

    done = _finished_shapes(out, expected_rows(config), MATMUL_ROW_KEY, keep_other_rows=lambda row: False)
    config = dataclasses.replace(config, shapes=tuple(s for s in config.shapes if s.name not in done))
    console.print(f"resuming {out}: {len(done)} shapes finished, {len(config.shapes)} to measure")
    return config, read_metadata(out)


def _finished_shapes(out: Optional[Path], expected: dict, key_columns: tuple[str, ...], keep_other_rows) -> set[str]:
    """The shapes of the run in `out` that hold every expected row; its CSV keeps their rows and those
    `keep_other_rows` accepts, and loses the rest (they are measured again)."""
    from fp8bench.harness.results import RESULTS_CSV, finished_shapes, keep_rows, load_results

    if out is None or not (out / RESULTS_CSV).exists():
        raise typer.BadParameter("--resume continues a run: give its folder with --out")
    try:
        done = finished_shapes(load_results(out), expected, key_columns)
        keep_rows(out, lambda row: row["case"] in done or keep_other_rows(row))
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    return done


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
    report: bool = typer.Option(True, help="write the HTML reports when the run ends"),
) -> None:
    """FP8 quantize kernels: GPU time, GB/s and % of the copy bandwidth, ours against torch, torch.compile and TE."""
    from fp8bench.benchmarks import cast as casts
    from fp8bench.model.hardware import spec_for_device_name
    from fp8bench.nn.recipes import Fp8Dtype
    from fp8bench.harness.timing import TIMER_CHOICES, TimerChoice

    recipes = tuple(dict.fromkeys(r for name in recipe or ["all"] for r in choice(name, casts.RECIPE_CHOICES, "recipe")))
    fp8_dtype = choice(dtype, {d.value: (d,) for d in Fp8Dtype}, "fp8 dtype")[0]
    if timer not in TIMER_CHOICES:
        raise typer.BadParameter(f"unknown timer {timer!r}; choose one of: {', '.join(TIMER_CHOICES)}")
    try:
        shape_list = casts.generate_shapes(shape_gen, M, K)
        config = casts.CastConfig(
            tuple(shape_list), recipes, tuple(dict.fromkeys(backend or casts.IMPLEMENTATIONS)), fp8_dtype,
            input_dtype, power_of_two, TimingConfig(repeats=repeats),
        )  # fmt: skip
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    spec = spec_for_device_name(require_cuda("cast"))  # recorded with the run; the copy is the ceiling
    body = lambda writer, on_row: casts.run_cast(config, writer, TimerChoice(timer, config.timing.flush_l2), on_row)  # noqa: E731
    _run_benchmark("cast", shape_gen, out, report, body, spec, config.timing, (casts.print_cast_row, casts.print_cast_summary))


def _run_benchmark(
    benchmark: str, label: str, out: Optional[Path], report: bool, body, spec, timing: TimingConfig, printers=None,
    resumed_from: Optional[dict] = None,
) -> None:
    """Open the run folder, run `body(writer, on_row)`, print the table, write reports.

    `printers` is (print_row, print_summary) for benchmarks whose rows are not GEMMs (default: console's).
    `resumed_from`: the metadata of the run this one continues, kept inside the new metadata.
    Ctrl-C stops the run; every finished case is already in the CSV and the reports cover them.
    """
    from fp8bench.report import console as gemm_printers
    from fp8bench.harness.env import run_metadata
    from fp8bench.harness.results import RunWriter

    print_row, print_summary = printers or (gemm_printers.print_row, gemm_printers.print_summary)
    run_dir = out or default_run_dir(benchmark, label)
    metadata = run_metadata(
        command_line(), {"benchmark": benchmark, "gpu_spec": spec.key if spec else None, "timing": dataclasses.asdict(timing)}
    )
    if resumed_from is not None:
        metadata["resumed_from"] = resumed_from
    interrupted = False
    with RunWriter(run_dir, metadata) as writer:
        console.print(f"[bold]{benchmark}[/] on {metadata.get('gpu_name')} -> {writer.csv_path}")
        try:
            rows = body(writer, lambda row: print_row(console, row))
        except KeyboardInterrupt:
            interrupted = True
            rows = None
    if interrupted:
        err_console.print(f"[yellow]interrupted: the finished cases are in {run_dir / 'results.csv'}[/]")
    else:
        print_summary(console, rows)
    if report:
        try:
            from fp8bench.report.write import write_reports
        except ImportError as err:  # plotly missing on a bare GPU host: the results stand without pages
            err_console.print(f"[yellow]no HTML reports: {err.name} is not installed; `fp8bench report {run_dir}` writes them later[/]")
        else:
            for page in write_reports(run_dir):
                console.print(f"report: {page}")
    if interrupted:
        raise typer.Exit(130)


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


@app.command()
def publish(
    reports: Path = typer.Argument(..., help="a reports tree: <gpu-model>/<run>/results.csv, or <gpu-model>/<run>/<entry>/results.csv"),
    out: Path = typer.Option(Path("site"), help="the site folder; an existing site is brought up to date"),
    jobs: Optional[int] = typer.Option(None, min=1, help="run folders rendered at once (default: one per CPU)"),
) -> None:
    """Build a static site of every run: per GPU model the latest runs, history charts, compare pages, reports."""
    from rich.progress import Progress

    from fp8bench.harness.validate import printable, usage_errors
    from fp8bench.publish.site import publish as build_site

    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:  # no bars in logs
        task = progress.add_task("publishing", total=None)

        def advance(done: int, total: int, what: str) -> None:
            progress.update(task, completed=done, total=total, description=escape(printable(what)))

        with usage_errors():
            published = build_site(reports, out, advance, jobs)
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
    resume: bool = typer.Option(False, help="matmul and roofline entries whose run folder holds results continue it (--resume)"),
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
    """Compare a run with a baseline. Exit 0 pass, 1 regression, 2 usage error, 3 inconclusive (when asked), 4 other GPU model."""
    from fp8bench.gate import gate as gating

    def body():
        return gating.compare_trees(base, new, gating.resolve_config(suite, metric, fail_on_inconclusive))

    raise typer.Exit(gating.conclude(body, _outputs(markdown, json_path, junit), console))


@app.command()
def gate(
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
    from fp8bench.gate import gate as gating
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
            raise gating.UsageError(f"fp8bench {shlex.join(argv)}: {err.format_message()}") from None
        if code:  # e.g. 130: interrupted; the finished cases are in the run folder
            raise typer.Exit(code)

    def body():
        config = gating.resolve_config(suite, metric, fail_on_inconclusive)
        run_dir = out or default_run_dir("gate", suite.stem)
        return gating.gate(suite, baseline, baseline_dir, run_dir, config, device, invoke, runs, rerun, console)

    raise typer.Exit(gating.conclude(body, _outputs(markdown, json_path, junit), console))


baseline_app = typer.Typer(help="Runs kept for `compare` and `gate`, keyed by GPU model.", no_args_is_help=True)
app.add_typer(baseline_app, name="baseline")


@baseline_app.command("save")
def baseline_save(
    run: Path = typer.Argument(..., help="a run folder, a results CSV, or a folder of suite runs"),
    name: str = typer.Option(..., help="the baseline's name, e.g. main"),
    root: Path = typer.Option(Path("baselines"), "--dir", help="baselines root; the run goes to <dir>/<gpu-model>/<name>/"),
    force: bool = typer.Option(False, help="replace an existing baseline of that name"),
) -> None:
    """Copy a run (results.csv + metadata.json) into the baselines folder of its GPU model."""
    from fp8bench.gate import baseline as baselines
    from fp8bench.harness.validate import usage_errors

    with usage_errors():
        saved = baselines.save(run, name, root, force)
    console.print(f"baseline {escape(repr(name))} saved to {escape(str(saved))}")


@app.command()
def roofline(
    shape_gen: str = typer.Option("square", help="square | pow2-extended | llama | sweep | dsv3 | custom"),
    granularity: str = typer.Option("all", help="keep the recipes of: tensorwise | axiswise (alias rowwise) | blockwise | all"),
    recipe: Optional[list[str]] = typer.Option(None, help="repeatable; tensorwise | tensorwise-delayed | rowwise | rowwise_with_gw_hp | blockwise | all (default)"),
    implementation: Optional[list[str]] = typer.Option(None, help="repeatable; triton | torchao | te | unfused | all (default)"),
    M: Optional[int] = typer.Option(None, "--M", help="with --shape-gen custom"),
    K: Optional[int] = typer.Option(None, "--K", help="with --shape-gen custom"),
    N: Optional[int] = typer.Option(None, "--N", help="with --shape-gen custom"),
    gpu: str = typer.Option("auto", help="GPU model whose ceilings to use: auto (detect) or a hardware-table key"),
    calibration: Optional[Path] = typer.Option(None, help="a profile from `fp8bench calibrate` (default: calibration/<gpu>.json if it exists)"),
    measure: bool = typer.Option(True, "--measure/--no-measure", help="also measure the layer (needs a GPU; predictions only without one)"),
    shape_name: Optional[list[str]] = typer.Option(None, help="repeatable; keep the shapes whose name contains this (e.g. llama3-8b.)"),
    repeats: int = typer.Option(5, min=1, help="measured: independent repeats per case (each with its own warm-up)"),
    eager: bool = typer.Option(True, "--eager/--no-eager", help="measured: also our layer (Float8LayerNormLinear) and the BF16 layer without torch.compile"),
    out: Optional[Path] = typer.Option(None, help="run folder (default runs/<time>-roofline-<shape-gen>)"),
    resume: bool = typer.Option(
        False, help="continue the measured run in --out with the same options: its finished shapes are kept, the rest measured"
    ),
) -> None:
    """LayerNorm -> Linear -> sigmoid, fwd + bwd: predicted FP8 speedup per recipe and implementation, and
    on a GPU the measured step of BF16, ours, torchao and TransformerEngine beside it (fp8bench.benchmarks.layer)."""
    from fp8bench.model import roofline as model
    from fp8bench.benchmarks import shapes
    from fp8bench.model.calibrate import default_profile_path, load_profile
    from fp8bench.harness.env import cuda_device_name, run_metadata
    from fp8bench.model.hardware import resolve_gpu, spec_for_device_name
    from fp8bench.nn.recipes import RECIPE_CHOICES
    from fp8bench.harness.results import RunWriter

    granularities = choice(granularity, GRANULARITY_CHOICES, "granularity")
    recipes = [r for name in recipe or ["all"] for r in choice(name, RECIPE_CHOICES, "recipe")]
    recipes = [r for r in dict.fromkeys(recipes) if r.granularity in granularities]
    if not recipes:
        raise typer.BadParameter(f"no chosen recipe scales with granularity {granularity!r}")
    impls = tuple(dict.fromkeys(i for name in implementation or ["all"] for i in choice(name, model.IMPLEMENTATION_CHOICES, "implementation")))
    device_name = cuda_device_name()
    try:
        shape_list = shapes.generate(shape_gen, M, K, N)
        spec = resolve_gpu(gpu, device_name)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if shape_name:
        shape_list = [s for s in shape_list if any(part in s.name for part in shape_name)]
        if not shape_list:
            raise typer.BadParameter(f"no {shape_gen} shape has a name containing any of {shape_name}")
    measuring = measure and device_name is not None
    if measuring and spec_for_device_name(device_name) is not spec:
        raise typer.BadParameter(f"--gpu {gpu} names another GPU than this {device_name}; add --no-measure to predict for it")
    ceilings = [model.spec_ceilings(spec)]
    profile_path = calibration or default_profile_path(spec.key)
    if calibration is not None or profile_path.exists():
        try:
            profile = load_profile(profile_path)
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None
        if profile.gpu_key != spec.key:
            raise typer.BadParameter(f"{profile_path} was measured on {profile.gpu_key}, not {spec.key}")
        ceilings.append(model.calibrated_ceilings(profile, profile_path))
    config = model.RooflineConfig(tuple(shape_list), tuple(recipes), impls, tuple(ceilings))

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
    if layer_config:
        from dataclasses import asdict

        extra["timing"] = asdict(layer_config.timing)
    resumed = _resume_roofline(layer_config, out) if resume else None
    earlier_kernels = ()
    if resumed:
        layer_config, extra["resumed_from"], earlier_kernels = resumed
    with RunWriter(run_dir, run_metadata(command_line(), extra)) as writer:
        if resumed:  # the first call wrote every shape's predictions
            console.print(f"predictions: kept from the first call in {writer.csv_path}")
        else:
            layers = model.run_roofline(config, writer)
            model.print_tables(console, config, layers)
            console.print(f"predictions -> {writer.csv_path} (kernels: {run_dir / model.KERNELS_CSV})")
        if layer_config:
            _measure_layer(layer_config, writer, ceilings[-1], earlier_kernels)


def _resume_roofline(config, out: Optional[Path]) -> tuple:
    """The measured layer's config narrowed to the shapes the run in `out` has not finished (None when
    none is left), the earlier run's metadata, and its measured kernels of the finished shapes. Prediction
    rows stay: the first call wrote them for every shape."""
    import pandas as pd

    from fp8bench.benchmarks.layer import KERNELS_CSV
    from fp8bench.harness.results import read_metadata

    expected = {shape.name: {(shape.name, c.backend, c.recipe_name) for c in config.cases(shape)} for shape in config.shapes}
    done = _finished_shapes(out, expected, ("case", "backend", "recipe"), keep_other_rows=lambda row: row["backend"] == "model")
    kernels_csv = out / KERNELS_CSV
    kernels = pd.read_csv(kernels_csv) if kernels_csv.exists() else pd.DataFrame(columns=["case"])
    left = tuple(s for s in config.shapes if s.name not in done)
    console.print(f"resuming {out}: {len(done)} shapes finished, {len(left)} to measure")
    return (dataclasses.replace(config, shapes=left) if left else None, read_metadata(out),
            kernels[kernels["case"].isin(done)].to_dict("records"))


def _measure_layer(config, writer, ceilings, earlier_kernels=()) -> None:
    """The measured half of `roofline` (fp8bench.benchmarks.layer); Ctrl-C keeps the finished rows."""
    from fp8bench.benchmarks import layer
    from fp8bench.harness.timing import CuptiTimer, GpuClock

    try:
        rows = layer.run_layer(config, writer, ceilings, CuptiTimer(GpuClock()), on_row=lambda row: console.print(layer.row_line(row)),
                               earlier_kernels=earlier_kernels)
    except KeyboardInterrupt:
        err_console.print(f"[yellow]interrupted: the finished cases are in {writer.csv_path}[/]")
        raise typer.Exit(130) from None
    layer.print_rows(console, rows)
    console.print(f"measured -> {writer.csv_path} (kernels: {writer.run_dir / layer.KERNELS_CSV})")


@app.command()
def calibrate(
    out: Optional[Path] = typer.Option(None, help="profile file (default calibration/<gpu>.json)"),
    gpu: str = typer.Option("auto", help="hardware-table key the profile is for: auto (detect) or a key"),
    repeats: int = typer.Option(5, min=1, help="independent repeats per measurement"),
) -> None:
    """Measure this GPU's achievable GEMM TFLOPS, copy bandwidth and launch floor for the roofline."""
    from fp8bench.model.calibrate import REQUIRED_FP8, default_profile_path, measure_profile, save_profile
    from fp8bench.harness.env import run_metadata
    from fp8bench.model.hardware import gpu_choices, resolve_gpu

    if gpu not in gpu_choices():
        raise typer.BadParameter(f"unknown GPU {gpu!r}; choose one of: {', '.join(gpu_choices())}")
    device_name = require_cuda("calibrate")
    try:
        spec = resolve_gpu(gpu, device_name)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    console.print(f"[bold]calibrate[/] {device_name} as {spec.key}")
    try:
        profile = measure_profile(spec.key, device_name, TimingConfig(repeats=repeats), run_metadata(command_line()), console.print)
    except ValueError as err:
        raise EnvironmentProblem(str(err)) from None
    path = save_profile(profile, out or default_profile_path(spec.key))
    console.print(
        f"BF16 {100 * profile.bf16_tflops / spec.bf16_tflops:.0f}% and FP8 tensorwise "
        f"{100 * profile.fp8_tflops[REQUIRED_FP8] / spec.fp8_tflops:.0f}% of dense peak; copy "
        f"{100 * profile.copy_tbps / spec.mem_bw_tbps:.0f}% of {spec.mem_bw_tbps} TB/s -> {path}"
    )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
