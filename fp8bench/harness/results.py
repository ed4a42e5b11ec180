"""One result schema for every benchmark level, and a writer that appends rows as cases finish.

A run is a folder: `results.csv` (one row per case, flushed row by row so an interrupted run loses
nothing) and `metadata.json` (the machine and software it ran on). Reports, comparisons and the site
all read runs through `load_run`.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from fp8bench.config import Status

RESULTS_CSV = "results.csv"
METADATA_JSON = "metadata.json"


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # "id" identifies a case, "measure" is measured, "derived" is computed from measures,
    # "predicted" comes from the roofline model (fp8bench.model.roofline), not from the GPU
    dtype: str  # "str", "int" or "float"
    doc: str


SCHEMA: tuple[Column, ...] = (
    Column("benchmark", "id", "str", "matmul | cast | roofline | e2e"),
    Column("case", "id", "str", "shape name (e.g. 4096x4096x4096 or llama3-8b.wqkv.M8192)"),
    Column("M", "id", "int", "rows of the left operand / output"),
    Column("K", "id", "int", "reduction dimension"),
    Column("N", "id", "int", "columns of the output"),
    Column("granularity", "id", "str", "none (BF16 reference) | tensorwise | axiswise | blockwise"),
    Column("backend", "id", "str", "bf16 | cublas | triton | torchao | te | ..."),
    Column("recipe", "id", "str", "layer/model recipe name, or the GEMM's operand dtypes"),
    Column("fast_accum", "id", "str", "on | off | n/a"),
    Column("world_size", "id", "str", "e2e: GPUs the model trains on (FSDP2 beyond 1); empty for the other benchmarks"),
    Column("compile", "id", "str", "e2e: torch.compile of none | block (each transformer block) | model"),
    Column("activation_checkpointing", "id", "str", "e2e: none | selective (products and attention saved) | full, per block"),
    Column("lm_head", "id", "str", "e2e: bf16 | fp8, the precision of the LM head's products"),
    Column("options", "id", "str", "JSON of further options, e.g. the kernel config chosen"),
    Column("status", "measure", "str", "ok | unsupported: <reason> | failed: <reason>"),
    Column("median_ms", "measure", "float", "GPU kernel time: median over repeats of each repeat's median"),
    Column("spread_pct", "measure", "float", "repeat-to-repeat spread: interquartile range / median of the repeat medians, %"),
    Column("repeats", "measure", "int", "independent repeats (each with its own warm-up)"),
    Column("samples", "measure", "int", "timed samples per repeat"),
    Column("repeat_ms", "measure", "str", "each repeat's median, ms, ';'-separated (the unit for comparisons)"),
    Column("wall_ms", "measure", "float", "host wall time per call, synchronized, median"),
    Column("timer", "measure", "str", "cuda-events | cupti | fake"),
    Column("sm_clock_mhz", "measure", "float", "median SM clock sampled after each repeat"),
    Column("sm_clock_min_mhz", "measure", "float", "lowest SM clock sampled (throttling shows here)"),
    Column("throttled", "measure", "str", "yes: an SM clock read during the settle showed the power cap steering "
           "the clock, so each repeat ran the throttled window (TimingConfig.throttled_samples_ms) | no"),
    Column("dropped_repeats", "measure", "int", "repeats taken and dropped because the window of the last "
           "`repeats` still drifted (fp8bench.harness.timing)"),
    Column("tflops", "derived", "float", "2MKN / median time; e2e: the model's FLOPs per step (fp8bench.nn.llama's formula) / median time"),
    Column("pct_peak", "derived", "float", "matmul: tflops as % of the GPU's dense peak for the operand dtype; "
           "cast: GB/s as % of the device copy bandwidth measured in the same run"),
    Column("gbps", "derived", "float", "bytes moved / median time (memory-bound benchmarks)"),
    Column("speedup_vs_bf16", "derived", "float", "BF16 reference time / this time, same shape, same run"),
    Column("rel_err", "derived", "float", "||out - bf16 out|| / ||bf16 out|| on the same random inputs"),
    Column("predicted_ms", "predicted", "float", "roofline model's GPU time (benchmark=roofline): a prediction, never measured"),
    Column("predicted_speedup", "predicted", "float", "predicted BF16 time / predicted_ms, same model and ceilings"),
    Column("bound", "predicted", "str", "compute | memory | launch: the bound holding most of the predicted time"),
    # The measured layer of `fp8bench roofline` (fp8bench.benchmarks.layer): its kernel time by kind of kernel, from
    # the CUPTI trace (mean per step), and its accuracy against the BF16 layer on the same inputs and weights.
    Column("gemm_ms", "measure", "float", "layer or model step: GPU time of its matrix-product kernels, ms (by kernel name)"),
    Column("cast_ms", "measure", "float", "layer or model step: GPU time of its FP8 cast, amax and scale kernels, ms"),
    Column("other_ms", "measure", "float", "layer or model step: GPU time of every other kernel (LayerNorm, sigmoid, copies), ms"),
    Column("sqnr_out_db", "derived", "float", "SQNR of the layer output vs the BF16 eager layer, dB (empty: identical)"),
    Column("sqnr_grad_input_db", "derived", "float", "SQNR of the layer input's gradient vs the BF16 eager layer, dB"),
    Column("sqnr_grad_weight_db", "derived", "float", "SQNR of the linear weight's gradient vs the BF16 eager layer, dB"),
    # The model of `fp8bench e2e` (fp8bench.benchmarks.e2e): a training step's throughput, memory and loss, and the
    # rest of its kernel time by class (beside gemm_ms, cast_ms and other_ms) from one profiled step.
    Column("tokens_per_s", "derived", "float", "e2e: tokens per second per GPU, batch x seq / median step time"),
    Column("mfu_bf16_pct", "derived", "float", "e2e: tflops as % of the GPU's dense BF16 peak"),
    Column("mfu_fp8_pct", "derived", "float", "e2e: tflops as % of the GPU's dense FP8 peak"),
    Column("mem_alloc_gb", "measure", "float", "e2e: peak memory allocated by torch over the measured steps, GB (1e9 bytes)"),
    Column("mem_reserved_gb", "measure", "float", "e2e: peak memory reserved by torch's caching allocator, GB"),
    Column("final_loss", "measure", "float", "e2e: training loss of the last step (mean over ranks)"),
    Column("attention_ms", "measure", "float", "e2e step: GPU time of attention kernels, ms"),
    Column("norm_act_ms", "measure", "float", "e2e step: GPU time of RMSNorm and SwiGLU kernels (with casts fused into them), ms"),
    Column("optimizer_ms", "measure", "float", "e2e step: GPU time of the AdamW kernels, ms"),
    Column("comm_ms", "measure", "float", "e2e step: GPU time of collectives and FSDP2's buffer copies, ms (overlaps compute)"),
    Column("allgather_gb", "derived", "float", "e2e: bytes FSDP2 all-gathers per step per rank, GB, from parameter sizes and dtypes"),
    Column("ideal_speedup", "predicted", "float", "e2e: the BF16 reference's step with every converted linear's GEMMs at the "
           "FP8 rate (calibrated where a profile exists), casts free: the most FP8 can give this model"),
    Column("measured_vs_predicted", "derived", "float", "speedup_vs_bf16 / predicted_speedup: the share of the modelled gain measured"),
)
COLUMNS: tuple[str, ...] = tuple(c.name for c in SCHEMA)
ID_COLUMNS: tuple[str, ...] = tuple(c.name for c in SCHEMA if c.kind == "id")
# Id columns that only the e2e benchmark sets: files of the other benchmarks may lack them (they read as empty).
OPTIONAL_ID_COLUMNS: tuple[str, ...] = ("world_size", "compile", "activation_checkpointing", "lm_head")


def status_text(status: Status, reason: str = "") -> str:
    return status.value if status is Status.OK else f"{status.value}: {reason}"


@dataclass
class Row:
    """A result row under construction; unset measurements are written as empty cells."""

    values: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.values) - set(COLUMNS)
        if unknown:
            raise KeyError(f"not in the result schema: {sorted(unknown)}")

    def as_csv(self) -> list[str]:
        return [_cell(self.values.get(name)) for name in COLUMNS]


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


class RunWriter:
    """Appends rows to a run's CSV, flushing each one, and writes the metadata beside it."""

    def __init__(self, run_dir: Path, metadata: Mapping[str, Any]):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.run_dir / RESULTS_CSV
        write_metadata(self.run_dir, metadata)
        fresh = not self.csv_path.exists() or self.csv_path.stat().st_size == 0
        if not fresh:
            with self.csv_path.open(newline="") as existing:
                header = next(csv.reader(existing), [])
            if tuple(header) != COLUMNS:
                raise ValueError(f"{self.csv_path} was written with another result schema; give the run a new folder")
        self._file = self.csv_path.open("a", newline="")
        self._csv = csv.writer(self._file)
        if fresh:
            self._csv.writerow(COLUMNS)
            self._file.flush()

    def append(self, row: Row) -> None:
        self._csv.writerow(row.as_csv())
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def finished_shapes(results: pd.DataFrame, expected: Mapping[str, set[tuple[str, ...]]], key_columns: tuple[str, ...]) -> set[str]:
    """Names of the shapes of `expected` (shape name -> the keys of its rows, over `key_columns`) whose
    every row is in `results`: what a resumed run keeps."""
    present = set(zip(*(results[c].astype(str) for c in key_columns)))
    return {name for name, keys in expected.items() if keys <= present}


def keep_rows(run_dir: Path, keep: Callable[[dict[str, str]], bool]) -> None:
    """Rewrite a run's CSV with only the rows `keep` accepts (a resumed run measures the rest again)."""
    csv_path = Path(run_dir) / RESULTS_CSV
    with csv_path.open(newline="") as existing:
        rows = list(csv.reader(existing))
    if not rows or tuple(rows[0]) != COLUMNS:
        raise ValueError(f"{csv_path} was written with another result schema; it cannot be resumed")
    with csv_path.open("w", newline="") as rewritten:
        csv.writer(rewritten).writerows([rows[0], *(row for row in rows[1:] if keep(dict(zip(COLUMNS, row))))])


def write_metadata(run_dir: Path, metadata: Mapping[str, Any]) -> None:
    (Path(run_dir) / METADATA_JSON).write_text(json.dumps(dict(metadata), indent=2, sort_keys=True, default=str))


def read_metadata(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / METADATA_JSON
    return json.loads(path.read_text()) if path.exists() else {}


def load_results(path: Path) -> pd.DataFrame:
    """A run's rows with the schema's dtypes; `path` is a run folder or a results CSV."""
    path = Path(path)
    csv_path = path / RESULTS_CSV if path.is_dir() else path
    if not csv_path.exists():
        raise FileNotFoundError(f"no results at {csv_path}")
    frame = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    missing_ids = [c for c in (*ID_COLUMNS, "status") if c not in frame.columns and c not in OPTIONAL_ID_COLUMNS]
    if missing_ids:
        raise ValueError(f"{csv_path} does not follow the result schema: missing {missing_ids}")
    # Files outlive the schema: measurement columns added after a run was written read as empty.
    for column in COLUMNS:
        if column not in frame.columns:
            frame[column] = ""
    for column in SCHEMA:
        if column.dtype in ("int", "float"):
            frame[column.name] = pd.to_numeric(frame[column.name].replace("", None), errors="coerce")
            if column.dtype == "int" and not frame[column.name].isna().any():
                frame[column.name] = frame[column.name].astype("int64")
    return frame[list(COLUMNS)]


def repeat_times(cell: str) -> list[float]:
    """Parse a `repeat_ms` cell into floats."""
    return [float(x) for x in cell.split(";") if x]


def format_repeat_times(times: Iterable[float]) -> str:
    return ";".join(f"{t:.6g}" for t in times)


def measurement_values(m: Any) -> dict[str, Any]:
    """The schema's measured columns from one fp8bench.harness.timing.Measurement."""
    return {
        "median_ms": m.median_ms,
        "spread_pct": m.spread_pct,
        "repeats": len(m.repeat_ms),
        "samples": m.samples,
        "repeat_ms": format_repeat_times(m.repeat_ms),
        "wall_ms": m.wall_ms,
        "timer": m.timer,
        "sm_clock_mhz": m.sm_clock_median,
        "sm_clock_min_mhz": m.sm_clock_min,
        "throttled": "yes" if m.throttled else "no",
        "dropped_repeats": m.dropped_repeats,
    }
