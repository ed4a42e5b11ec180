"""curves.csv.gz, the numerics benchmark's step-wise values: its columns, how it is written and read, the
loss gap, a strict reader of its loss curves, and the comparison of two runs' curves that gates a
`fp8bench numerics loss` run in CI.

Per-layer tensor statistics go to a second file, TENSOR_STATS_CSV (the same columns), at the steps
`stats_recorded_at` names: every step of the start, where scales settle, then a thinning schedule, and
the last step; CURVES_CSV keeps every step's loss and gradient norm. A 1000-step run of llama-25m with
every recipe's statistics stays under 2 MiB this way.

Both files are gzip-compressed CSV written by `GzipRows`: each flush appends the rows written since the
last one as a gzip member of its own, so what a flush appended stays whole whatever happens after it.
`read_members` reads the members in order as one text; a run killed while it appended leaves its last
member cut short, and the whole rows decompressed before the cut are kept. `repair` cuts such a member
off before a resumed run appends after it. A run folder of an older fp8bench holds the curves as plain
text, LEGACY_CURVES_CSV: every reader reads it (`curves_file`, `read_values_text`), and a resumed run
converts it first (`convert_legacy_curves`).

The loss gap of a curve to a reference curve at a step is the mean loss over the last 10% of the steps
up to it, relative to the reference's over the same steps (positive where worse); at the last step it is
the gap over the last 10% of the run. The numerics benchmark writes it at CHECKPOINTS; `compare_loss`
compares a new run's curves with a stored reference run's at the same checkpoints, within a relative
tolerance either way (as torchtitan's loss-compare check: a reproduced run that moved is news, whichever
way it moved).

Whether a gap is more than run-to-run noise: `bf16_noise` is the spread of the BF16 curves' end-of-run
loss over their seeds, and `SeedGaps` a recipe's gaps over its seeds (each to BF16 with the same seed),
their mean and the band that noise alone would give it.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fp8bench.harness.validate import MalformedFile, UsageError, read_text, shown

CURVES_CSV = "curves.csv.gz"
LEGACY_CURVES_CSV = "curves.csv"  # plain text: the curves file of a run folder written before CURVES_CSV
TENSOR_STATS_CSV = "tensor_stats.csv.gz"
CURVE_COLUMNS = ("curve", "step", "metric", "layer", "role", "value")
# Per layer and tensor role (fp8bench.nn.tensor_stats): what TENSOR_STATS_CSV holds.
STAT_METRICS = ("underflow_pct", "saturate_pct", "amax", "history_amax", "scale", "sqnr_db")
# (up to this step, record every n-th step): every step while delayed scaling's histories fill, then thinner.
STATS_SCHEDULE = ((50, 1), (200, 10), (None, 50))
LAST_FRACTION = 0.1  # the loss gap is over the last 10% of steps
GAP_TARGET = 0.01  # an FP8 recipe should stay within 1% of BF16's loss
CHECKPOINTS = (0.25, 0.5, 0.75, 1.0)  # fractions of the run at which a gap is written and compared


def last_fraction_mean(losses: Sequence[float]) -> float:
    """Mean of the last 10% of the losses (at least one)."""
    tail = losses[-max(1, math.ceil(LAST_FRACTION * len(losses))):]
    return sum(tail) / len(tail)


def relative_gap(losses: Sequence[float], reference_losses: Sequence[float]) -> float:
    """(mean loss - reference's) / reference's over the last 10% of steps: positive where worse."""
    reference = last_fraction_mean(reference_losses)
    return (last_fraction_mean(losses) - reference) / reference


def bf16_noise(bf16_losses: Sequence[Sequence[float]]) -> float:
    """The run-to-run noise of one curve's end-of-run loss: the sample standard deviation of the BF16 curves'
    last-10% means (one per seed) relative to their mean; NaN with fewer than two seeds."""
    means = [last_fraction_mean(losses) for losses in bf16_losses]
    if len(means) < 2:
        return math.nan
    centre = sum(means) / len(means)
    return math.sqrt(sum((m - centre) ** 2 for m in means) / (len(means) - 1)) / centre


@dataclass(frozen=True)
class SeedGaps:
    """A recipe's loss gaps, one per seed, each to BF16 with the same seed (over the last 10% of steps), and
    the BF16 noise (bf16_noise). Were FP8 no different from BF16, each gap would be the difference of two
    independent runs (standard deviation noise * sqrt(2)), their mean over n seeds noise * sqrt(2 / n):
    the gap is `within_noise` inside twice that."""

    gaps: tuple[float, ...]
    noise: float

    @property
    def mean(self) -> float:
        return sum(self.gaps) / len(self.gaps)

    @property
    def band(self) -> float:
        """Twice the standard deviation the mean gap would have from run-to-run noise alone (NaN: no noise measured)."""
        return 2 * self.noise * math.sqrt(2 / len(self.gaps))

    @property
    def within_target(self) -> bool:
        return abs(self.mean) <= GAP_TARGET  # False for NaN: a diverged curve is not within

    @property
    def within_noise(self) -> bool | None:
        return None if math.isnan(self.band) else abs(self.mean) <= self.band

    def describe(self) -> str:
        spread = f" (seeds {min(self.gaps):+.2%} .. {max(self.gaps):+.2%})" if len(self.gaps) > 1 else " (one seed)"
        noise = "" if self.within_noise is None else f"; {'within' if self.within_noise else 'OUTSIDE'} the noise (±{self.band:.2%})"
        return f"{self.mean:+.2%}{spread}{noise}; {'within' if self.within_target else 'OUTSIDE'} {GAP_TARGET:.0%}"


def seed_gaps(pairs: Sequence[tuple[Sequence[float], Sequence[float]]], bf16_losses: Sequence[Sequence[float]]) -> SeedGaps:
    """The gaps of (curve, BF16 curve of the same seed) `pairs`, with the noise of the BF16 curves `bf16_losses`."""
    return SeedGaps(tuple(relative_gap(losses, reference) for losses, reference in pairs), bf16_noise(bf16_losses))


def checkpoint_steps(steps: int) -> dict[int, float]:
    """The steps of a run of `steps` steps at CHECKPOINTS, each with its fraction (the larger where two meet)."""
    return dict(sorted({max(1, round(fraction * steps)): fraction for fraction in CHECKPOINTS}.items()))


def stats_recorded_at(step: int, steps: int) -> bool:
    """Whether a run of `steps` steps records the tensor statistics of `step` (STATS_SCHEDULE, and the last step)."""
    if step == steps:
        return True
    for until, every in STATS_SCHEDULE:
        if until is None or step <= until:
            return step % every == 0
    return False


# ---- the files: gzip members, one per flush ---------------------------------------------------------


def _csv_text(rows: Sequence[Sequence[object]]) -> str:
    buffer = io.StringIO(newline="")
    csv.writer(buffer).writerows(rows)
    return buffer.getvalue()


HEADER = _csv_text([CURVE_COLUMNS])  # the first line of a curves or statistics file


def append_member(path: Path, text: str) -> None:
    """`text` (whole rows) appended to the gzip file `path` as a member of its own: the members before it
    stay as they were, and a write cut short damages this member only."""
    with open(path, "ab") as handle:
        handle.write(gzip.compress(text.encode("utf-8"), mtime=0))


class GzipRows:
    """Rows of CURVE_COLUMNS bound for the gzip file `path`: held here until `flush` appends them as one
    member, after the header where the file has none yet. A last member cut short (a run killed while
    appending it) is cut off first (`repair`): what came after it could not be read."""

    def __init__(self, path: Path):
        self.path = Path(path)
        repair(self.path)
        self._buffer = io.StringIO(newline="")
        self._csv = csv.writer(self._buffer)

    def writerow(self, row: Sequence[object]) -> None:
        self._csv.writerow(row)

    def write(self, text: str) -> None:
        """Whole rows as CSV text, each with its line end."""
        self._buffer.write(text)

    def flush(self) -> None:
        text = self._buffer.getvalue()
        if not text:
            return
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        append_member(self.path, HEADER + text if fresh else text)
        self._buffer.seek(0)
        self._buffer.truncate()


@dataclass(frozen=True)
class Members:
    """What a gzip file of appended members holds: `text`, the rows of its whole members in order and the
    whole rows of a last member cut short; `whole`, its bytes up to the end of its last whole member; `cut`,
    what cut the rest short ("" where nothing did)."""

    text: str
    whole: int
    cut: str


_CHUNK = 1 << 16  # compressed bytes fed to the decompressor at a time: what it leaves over is at most this


def read_members(path: Path) -> Members:
    """The members of the gzip file `path`, each checked whole (its CRC and length) before the next is read.
    A last member cut short, or bytes after the whole members that do not decompress, end the text: the
    whole rows decompressed before them are kept, and `cut` says where it stopped. MalformedFile where the
    file is no gzip file at all, or its text is not UTF-8."""
    data = memoryview(Path(path).read_bytes())
    texts: list[bytes] = []
    whole, cut = 0, ""
    while whole < len(data) and not cut:
        stream = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # one gzip member: header, deflate data, CRC and length
        member: list[bytes] = []
        at = whole
        try:
            while not stream.eof and at < len(data):
                chunk = data[at : at + _CHUNK]
                member.append(stream.decompress(chunk))
                at += len(chunk)
        except zlib.error as err:
            if whole == 0 and not any(member):
                raise MalformedFile(path, f"not gzip-compressed ({err})") from None
            cut = f"the bytes from {whole} on do not decompress ({err})"
        if stream.eof:
            texts.append(b"".join(member))
            whole = at - len(stream.unused_data)
            continue
        cut = cut or f"the gzip member from byte {whole} on is cut short (the run was killed while writing it)"
        rest = b"".join(member)
        texts.append(rest[: rest.rfind(b"\n") + 1])
    try:
        text = b"".join(texts).decode("utf-8")
    except UnicodeDecodeError as err:
        raise MalformedFile(path, f"not UTF-8 text once decompressed (offset {err.start})") from None
    return Members(text, whole, cut)


def repair(path: Path) -> None:
    """The gzip file `path` cut back to its whole members where its last is cut short, so that members
    appended after it can be read; removed where no member is whole."""
    if not path.exists():
        return
    members = read_members(path)
    if not members.cut:
        return
    if members.whole:
        os.truncate(path, members.whole)
    else:
        path.unlink()


def read_values_text(path: Path) -> str:
    """The CSV text of a curves or statistics file: of a gzip file (a name ending `.gz`) its members, a last
    member cut short keeping its whole rows (read_members); of a plain one (LEGACY_CURVES_CSV) its text.
    MalformedFile naming the file: not one whole row, or a last line without its line end (in a plain file,
    a run killed while writing it; a gzip member holds whole rows)."""
    path = Path(path)
    if path.suffix != ".gz":
        text = read_text(path)
        if text and not text.endswith("\n"):
            raise MalformedFile(path, "its last line is torn (no newline): the run was killed while writing it")
        return text
    members = read_members(path)
    if members.cut and not members.text:
        raise MalformedFile(path, f"not one whole row: {members.cut}")
    if members.text and not members.text.endswith("\n"):
        raise MalformedFile(path, "its last line has no line end, though its gzip member is whole: not written by fp8bench")
    return members.text


def curves_file(run_dir: Path) -> Path | None:
    """A run folder's curves file: its CURVES_CSV, or the plain LEGACY_CURVES_CSV of a folder an older
    fp8bench wrote; None where it has neither. UsageError naming both where it holds both."""
    run_dir = Path(run_dir)
    found = [run_dir / name for name in (CURVES_CSV, LEGACY_CURVES_CSV) if (run_dir / name).is_file()]
    if len(found) > 1:
        raise UsageError(f"{found[0]} and {found[1]}: a run folder holds one curves file (the plain one is what an older "
                         "fp8bench wrote); remove the one that is not the run's")  # fmt: skip
    return found[0] if found else None


def convert_legacy_curves(run_dir: Path) -> Path | None:
    """The run folder's plain LEGACY_CURVES_CSV rewritten as its CURVES_CSV (the same rows, one member), the
    plain file removed; returns the new file, None where the folder holds no plain curves file (or one
    without values, removed). MalformedFile where the plain file is not a curves file or its last line is
    torn, UsageError where the folder holds both files."""
    legacy = curves_file(run_dir)
    if legacy is None or legacy.name != LEGACY_CURVES_CSV:
        return None
    header, _, values = read_values_text(legacy).partition("\n")
    if next(csv.reader([header]), []) != list(CURVE_COLUMNS):
        raise MalformedFile(legacy, f"not a curves file: its first line is {shown(header)}, not {list(CURVE_COLUMNS)}")
    target = legacy.with_name(CURVES_CSV)
    if values:
        partial = target.with_name(f"{CURVES_CSV}.partial")  # moved into place once written whole
        partial.unlink(missing_ok=True)
        rows = GzipRows(partial)
        rows.write(values)
        rows.flush()
        os.replace(partial, target)
    legacy.unlink()
    return target if values else None


# ---- the loss curves and their comparison ------------------------------------------------------------


def curves_path(run: Path) -> Path:
    """A run folder's curves file (curves_file), or `run` itself when it names a file; UsageError where there is none."""
    path = Path(run)
    if path.is_dir():
        path = curves_file(path) or path / CURVES_CSV
    if not path.is_file():
        raise UsageError(f"{path}: no such curves file (give a `fp8bench numerics loss` run folder or its {CURVES_CSV})")
    return path


def read_loss_curves(run: Path) -> dict[str, list[float]]:
    """Per curve of a run its training loss at steps 1..n, in the order the run wrote the curves.

    The file (read_values_text: a gzip file's whole rows, a plain file whose last line ends) is checked as
    it is read (MalformedFile naming it and the line): the curves columns, one field per column, a curve and
    metric on every row, a positive integer step, one value per (curve, step, metric, layer, role), a number
    for every loss (NaN included: a diverged run's loss), each loss curve's steps 1..n without a gap, and at
    least one loss curve."""
    path = curves_path(run)
    reader = csv.reader(io.StringIO(read_values_text(path), newline=""))
    try:
        records = [(reader.line_num, row) for row in reader]
    except csv.Error as err:
        raise MalformedFile(path, f"line {reader.line_num}: not CSV ({err})") from None
    if not records or tuple(records[0][1]) != CURVE_COLUMNS:
        raise MalformedFile(path, f"not a curves file: its columns are {shown(records[0][1] if records else [])}, not {list(CURVE_COLUMNS)}")
    seen: set[tuple[str, ...]] = set()
    losses: dict[str, dict[int, float]] = {}
    for line, row in records[1:]:
        if len(row) != len(CURVE_COLUMNS):
            raise MalformedFile(path, f"line {line} has {len(row)} fields, the header {len(CURVE_COLUMNS)}")
        curve, step_text, metric, layer, role, value = row
        if not curve or not metric:
            raise MalformedFile(path, f"line {line}: a value without its curve or metric")
        if not step_text.isdigit() or int(step_text) < 1:
            raise MalformedFile(path, f"line {line}: step {shown(step_text)} is not a positive integer")
        step = int(step_text)
        if (curve, str(step), metric, layer, role) in seen:
            raise MalformedFile(path, f"line {line}: a second {shown(metric)} of {shown(curve)} at step {step}")
        seen.add((curve, str(step), metric, layer, role))
        if metric == "loss":
            try:
                losses.setdefault(curve, {})[step] = float(value)
            except ValueError:
                raise MalformedFile(path, f"line {line}: loss {shown(value)} is not a number") from None
    if not losses:
        raise MalformedFile(path, "holds no loss curve (metric `loss`): not a `fp8bench numerics loss` run")
    for curve, by_step in losses.items():
        missing = sorted(set(range(1, max(by_step) + 1)) - set(by_step))
        if missing:
            raise MalformedFile(path, f"the loss curve {shown(curve)} has no step {missing[0]}")
    return {curve: [by_step[step] for step in sorted(by_step)] for curve, by_step in losses.items()}


@dataclass(frozen=True)
class Checkpoint:
    """One curve at one checkpoint: the new run's loss gap to the reference run's curve of the same name."""

    curve: str
    fraction: float
    step: int
    base_loss: float  # the reference's mean loss over the last 10% of the steps up to `step`
    new_loss: float
    gap: float

    def within(self, rtol: float) -> bool:
        return abs(self.gap) <= rtol  # False for NaN: a diverged curve fails


@dataclass(frozen=True)
class LossComparison:
    checkpoints: tuple[Checkpoint, ...]
    missing: tuple[str, ...]  # the reference's curves the new run lacks
    rtol: float

    @property
    def failed(self) -> tuple[Checkpoint, ...]:
        return tuple(c for c in self.checkpoints if not c.within(self.rtol))


def compare_loss(base: Path, new: Path, rtol: float) -> LossComparison:
    """Every loss curve of the reference run `base` against the same curve of `new`, at CHECKPOINTS and at the
    first step where the new curve's loss is no finite number (it diverged). UsageError where a curve has another number of steps in the two runs (not the same command)."""
    if not 0 <= rtol < math.inf:
        raise UsageError(f"--rtol must be a finite number at least 0, got {rtol}")
    reference, measured = read_loss_curves(base), read_loss_curves(new)
    checkpoints = []
    for curve, base_losses in reference.items():
        new_losses = measured.get(curve)
        if new_losses is None:
            continue
        if len(new_losses) != len(base_losses):
            raise UsageError(f"{curves_path(base)} holds {len(base_losses)} steps of {curve}, {curves_path(new)} {len(new_losses)}: "
                             "compare runs of the same command")  # fmt: skip
        steps = checkpoint_steps(len(base_losses))
        diverged = next((step for step, loss in enumerate(new_losses, 1) if not math.isfinite(loss)), None)
        if diverged is not None:  # a checkpoint of its own: the windows of the others may not reach it
            steps = dict(sorted({**steps, diverged: diverged / len(new_losses)}.items()))
        for step, fraction in steps.items():
            base_mean, new_mean = last_fraction_mean(base_losses[:step]), last_fraction_mean(new_losses[:step])
            checkpoints.append(Checkpoint(curve, fraction, step, base_mean, new_mean, (new_mean - base_mean) / base_mean))
    return LossComparison(tuple(checkpoints), tuple(curve for curve in reference if curve not in measured), rtol)
