"""One result schema for every benchmark level, and a writer that appends rows as cases finish.

A run is a folder: `results.csv` (one row per case, flushed row by row so an interrupted run loses
nothing) and `metadata.json` (the machine and software it ran on). Reports, comparisons and the site
all read runs through `load_run`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from fp8bench.config import Status
from fp8bench.harness.validate import MalformedFile, finite_number, json_type_name, read_text, shown, time_ms

RESULTS_CSV = "results.csv"
METADATA_JSON = "metadata.json"
TUNE_CACHE_JSON = "gemm-tune-cache.json"  # the autotuner's picks for a matmul run's products (fp8kernels.gemm_autotune)

# Values rows spell that readers (reports, comparisons) rely on:
COPY_RECIPE = "copy"  # cast: the device-to-device copy of the tensor, the reference and ceiling of its group
LAYER_REFERENCE_BACKEND = "bf16-compile"  # roofline: the measured step every speedup_vs_bf16 divides
MODEL_BACKEND = "model"  # roofline: the backend of the roofline model's prediction rows
BREAKDOWN_STEPS = 5  # roofline: gemm_ms / cast_ms / other_ms are the mean over this many flushed steps


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
    Column("activation_checkpointing", "id", "str", "e2e: none | selective (products, attention and amaxes saved) | selective-casts (FP8 casts too) | full, per block"),
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
    Column("speedup_vs_bf16", "derived", "float", "BF16 reference time / this time, same shape, same run (where the "
           "reference is bracketed: the geometric mean of reference_before_ms and reference_after_ms / this time)"),
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
    Column("mean_loss", "measure", "float", "e2e: mean training loss over the steps after the warm-up (mean over ranks)"),
    Column("attention_ms", "measure", "float", "e2e step: GPU time of attention kernels, ms"),
    Column("norm_act_ms", "measure", "float", "e2e step: GPU time of RMSNorm and SwiGLU kernels (with casts fused into them), ms"),
    Column("optimizer_ms", "measure", "float", "e2e step: GPU time of the AdamW kernels, ms"),
    Column("comm_ms", "measure", "float", "e2e step: GPU time of collectives and FSDP2's buffer copies, ms (overlaps compute)"),
    Column("compute_idle_ms", "measure", "float", "e2e step: time the compute stream had no kernel running, ms (fp8bench.harness.overlap)"),
    Column("exposed_comm_ms", "measure", "float", "e2e step: NCCL kernel time while the compute stream had none, ms: communication nothing overlaps"),
    Column("allgather_gb", "derived", "float", "e2e: bytes FSDP2 all-gathers per step per rank, GB, from parameter sizes and dtypes"),
    Column("ideal_speedup", "predicted", "float", "e2e: the BF16 reference's step with every converted linear's GEMMs at the "
           "FP8 rate (calibrated where a profile exists), casts free: the most FP8 can give this model"),
    Column("measured_vs_predicted", "derived", "float", "speedup_vs_bf16 / predicted_speedup: the share of the modelled gain measured"),
    # The reference measured before and after its group's other cases (fp8bench.harness.runner): a clock step
    # between it and the FP8 cases moves one of the two, and the speedup divides their geometric mean.
    Column("reference_before_ms", "measure", "float", "the group's reference median_ms, measured before the group's other cases"),
    Column("reference_after_ms", "measure", "float", "the group's reference median_ms, measured after the group's other cases"),
)
COLUMNS: tuple[str, ...] = tuple(c.name for c in SCHEMA)
ID_COLUMNS: tuple[str, ...] = tuple(c.name for c in SCHEMA if c.kind == "id")
# Id columns that only the e2e benchmark sets: files of the other benchmarks may lack them (they read as empty).
OPTIONAL_ID_COLUMNS: tuple[str, ...] = ("world_size", "compile", "activation_checkpointing", "lm_head")
# What names a case across runs: the id columns but `options`, which also records facts of the run (the
# kernel config a heuristic chose).
CASE_KEY: tuple[str, ...] = tuple(name for name in ID_COLUMNS if name != "options")


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
    """Appends rows to a run's CSV, flushing each one, and writes the metadata beside it. A folder that
    holds another run's results is refused (ValueError) unless `resume`: then rows join its CSV."""

    def __init__(self, run_dir: Path, metadata: Mapping[str, Any], resume: bool = False):
        self.run_dir = Path(run_dir)
        self.csv_path = self.run_dir / RESULTS_CSV
        if resume and _ends_torn(self.csv_path):  # a row appended after it would join the torn one
            keep_rows(self.run_dir, lambda row: True)
        fresh = not self.csv_path.exists() or self.csv_path.stat().st_size == 0
        if not fresh and not resume:
            raise ValueError(f"{self.run_dir} holds another run ({RESULTS_CSV}); give a new --out, or --resume to continue it")
        if not fresh:
            with self.csv_path.open(newline="") as existing:
                header = next(csv.reader(existing), [])
            if tuple(header) != COLUMNS:
                raise ValueError(f"{self.csv_path} was written with another result schema; give the run a new folder")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_metadata(self.run_dir, metadata)
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


def _records(csv_path: Path, text: str) -> list[tuple[int, list[str]]]:
    """The CSV records of a results file's text, each with the line it ends on; MalformedFile where it is not CSV."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return [(reader.line_num, row) for row in reader]
    except csv.Error as err:
        raise MalformedFile(csv_path, f"line {reader.line_num}: not CSV ({err})") from None


def _ends_torn(csv_path: Path) -> bool:
    """Whether a results file's last line lacks its newline: a run killed while it appended that row."""
    if not csv_path.exists() or csv_path.stat().st_size == 0:
        return False
    with csv_path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def read_rows(run_dir: Path) -> list[dict[str, str]]:
    """A run's finished rows as the CSV spells them (for resuming it): an unterminated last line is a row
    the run was killed while appending, left out (its case is measured again). ValueError for another
    schema; MalformedFile for any other row without one field per column."""
    csv_path = Path(run_dir) / RESULTS_CSV
    if not csv_path.exists():
        raise ValueError(f"{run_dir} holds no {RESULTS_CSV} to resume")
    text = read_text(csv_path)
    rows = _records(csv_path, text)
    if text and not text.endswith("\n"):
        rows.pop()  # csv.reader ends a record at the end of the text: the torn line is the last one
    if not rows:
        return []  # killed while writing the header: nothing finished
    if tuple(rows[0][1]) != COLUMNS:
        raise ValueError(f"{csv_path} was written with another result schema; it cannot be resumed")
    for line, row in rows[1:]:
        if len(row) != len(COLUMNS):
            raise MalformedFile(csv_path, f"line {line} has {len(row)} fields, the header {len(COLUMNS)} (a torn or shifted row)")
    return [dict(zip(COLUMNS, row)) for _, row in rows[1:]]


def keep_rows(run_dir: Path, keep: Callable[[dict[str, str]], bool]) -> None:
    """Rewrite a run's CSV with only the finished rows (read_rows) `keep` accepts (a resumed run measures
    the rest again), atomically: a new file, synced, renamed over the old one, so that a kill at any moment
    leaves either."""
    csv_path = Path(run_dir) / RESULTS_CSV
    kept = [row for row in read_rows(run_dir) if keep(row)]
    partial = csv_path.with_name(csv_path.name + ".partial")
    with partial.open("w", newline="") as rewritten:
        out = csv.writer(rewritten)
        out.writerow(COLUMNS)
        out.writerows([row[name] for name in COLUMNS] for row in kept)
        rewritten.flush()
        os.fsync(rewritten.fileno())
    os.replace(partial, csv_path)
    directory = os.open(csv_path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a crash
    finally:
        os.close(directory)


def write_metadata(run_dir: Path, metadata: Mapping[str, Any]) -> None:
    (Path(run_dir) / METADATA_JSON).write_text(json.dumps(dict(metadata), indent=2, sort_keys=True, default=str))


# The types of the metadata keys that comparisons and reports read. None is required here: a run of
# the CPU test suite records no GPU; `compare` refuses a run without gpu_name itself (exit 4).
_METADATA_TYPES: dict[str, tuple[type, ...]] = {
    "command": (str,),
    "started_utc": (str,),
    "versions": (dict,),
    "gpu_name": (str, type(None)),
    "gpu_memory_gib": (int, float, type(None)),
    "gpu_spec": (str, type(None)),
    "driver": (str, type(None)),
    "cuda_runtime": (str, type(None)),
    "power_limit_w": (int, float, type(None)),
    "sm_clock_max_mhz": (int, float, type(None)),
    "timing": (dict,),
}


def read_metadata(run_dir: Path) -> dict[str, Any]:
    """A run's metadata.json ({} where the run has none); MalformedFile unless it is UTF-8 JSON, an
    object, and its known keys of their types."""
    path = Path(run_dir) / METADATA_JSON
    if not path.exists():
        return {}

    def refuse_constant(name: str) -> None:
        raise ValueError(f"{name} is not a JSON number")

    try:
        data = json.loads(read_text(path), parse_constant=refuse_constant)
    except ValueError as err:
        if isinstance(err, MalformedFile):
            raise
        raise MalformedFile(path, f"not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise MalformedFile(path, f"holds {json_type_name(data)}, not a JSON object")
    for key, types in _METADATA_TYPES.items():
        if key in data and (not isinstance(data[key], types) or isinstance(data[key], bool)):
            raise MalformedFile(path, f"{key} is {json_type_name(data[key])} ({shown(data[key])})")
    bad_versions = [lib for lib, version in data.get("versions", {}).items() if not isinstance(version, (str, type(None)))]
    if bad_versions:
        raise MalformedFile(path, f"versions.{bad_versions[0]} is not a version string")
    return data


# The columns every results file has held since the schema's first version; later ones read as empty.
REQUIRED_COLUMNS: tuple[str, ...] = (
    *(c for c in ID_COLUMNS if c not in OPTIONAL_ID_COLUMNS), "status", "median_ms", "repeats", "repeat_ms", "timer"
)
_STATUSES = tuple(s.value for s in Status)
_TIME_COLUMNS = ("median_ms", "wall_ms")


def load_results(path: Path) -> pd.DataFrame:
    """A run's rows with the schema's dtypes; `path` is a run folder or a results CSV.

    The file is checked as it is read (MalformedFile naming it and the line): UTF-8, a header of
    schema columns, a last row that ends in a newline, every row as many fields as the header, a known status, numbers where the schema
    says so (finite; times positive), and `repeat_ms` holding `repeats` times. The frame is indexed by
    CSV line number and carries its file in `attrs["path"]`, so later checks can name both.
    """
    path = Path(path)
    csv_path = path / RESULTS_CSV if path.is_dir() else path
    if not csv_path.exists():
        raise FileNotFoundError(f"no results at {csv_path}")
    text = read_text(csv_path)
    rows = _records(csv_path, text)
    if not rows or not any(rows[0][1]):
        raise MalformedFile(csv_path, "empty: no header row")
    if len(rows) > 1 and not text.endswith("\n"):  # cut inside its last field it has every field, a wrong number
        raise MalformedFile(csv_path, f"line {rows[-1][0]} is torn (no newline): the run was killed while appending it; "
                                      "--resume measures its case again")  # fmt: skip
    header = rows[0][1]
    unknown = [c for c in header if c not in COLUMNS]
    if unknown:
        raise MalformedFile(csv_path, f"column {shown(unknown[0])} is not in the result schema")
    if len(set(header)) != len(header):
        raise MalformedFile(csv_path, f"the header names {shown(next(c for c in header if header.count(c) > 1))} twice")
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise MalformedFile(csv_path, f"does not follow the result schema: missing column(s) {', '.join(missing)}")
    records = []
    for line, row in rows[1:]:
        if len(row) != len(header):
            raise MalformedFile(csv_path, f"line {line} has {len(row)} fields, the header {len(header)} (a torn or shifted row)")
        record = dict(zip(header, row))
        problem = _row_problem(record)
        if problem:
            raise MalformedFile(csv_path, f"line {line}: {problem}")
        records.append(record)
    frame = pd.DataFrame(records, columns=header, index=[line for line, _ in rows[1:]], dtype=str)
    # Cast rows written before a cast's N was given a value (0: no product) left it empty: the same cases.
    if "N" in frame.columns:
        frame.loc[(frame["benchmark"] == "cast") & (frame["N"] == ""), "N"] = "0"
    # Files outlive the schema: measurement columns added after a run was written read as empty.
    for column in COLUMNS:
        if column not in frame.columns:
            frame[column] = ""
    for column in SCHEMA:
        if column.dtype in ("int", "float"):
            frame[column.name] = pd.to_numeric(frame[column.name].replace("", None), errors="raise")
            if column.dtype == "int" and not frame[column.name].isna().any():
                frame[column.name] = frame[column.name].astype("int64")
    frame = frame[list(COLUMNS)]
    frame.attrs["path"] = str(csv_path)
    return frame


_DTYPES = {c.name: c.dtype for c in SCHEMA}


def _row_problem(record: Mapping[str, str]) -> str | None:
    """What is wrong with one row of a results file, or None."""
    status = record["status"]
    if not (status == Status.OK.value or any(status.startswith(f"{s}: ") for s in _STATUSES if s != Status.OK.value)):
        return f"status {shown(status)} is none of {', '.join(_STATUSES)} (with ': <reason>')"
    if record["options"]:
        try:
            options = json.loads(record["options"])
        except ValueError:
            options = None
        if not isinstance(options, dict):
            return f"options {shown(record['options'])} is not a JSON object"
    for name, text in record.items():
        if not text or _DTYPES[name] == "str":
            continue
        try:
            value = time_ms(text) if name in _TIME_COLUMNS else finite_number(text)
        except ValueError as err:
            return f"{name}: {err}"
        if _DTYPES[name] == "int" and (value != int(value) or value < 0):
            return f"{name} {shown(text)} is not a count"
    if record["repeat_ms"]:
        try:
            times = repeat_times(record["repeat_ms"])
        except ValueError as err:
            return f"repeat_ms: {err}"
        if record["repeats"] and len(times) != int(float(record["repeats"])):
            return f"repeat_ms holds {len(times)} times but repeats is {record['repeats']} (a torn row?)"
    elif record["repeats"] and status == Status.OK.value:
        return f"repeats is {record['repeats']} but repeat_ms is empty"
    return None


def repeat_times(cell: str) -> list[float]:
    """Parse a `repeat_ms` cell: times in ms separated by ';', none for an empty cell (ValueError for
    anything else)."""
    return [time_ms(x) for x in str(cell).split(";")] if cell else []


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
