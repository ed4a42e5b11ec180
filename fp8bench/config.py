"""Names and frozen configuration shared by every benchmark level.

Everything a user can type on the command line is parsed here once, into enums and frozen
dataclasses that are valid by construction; the rest of the tool never re-validates.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# The scaling vocabulary is the kernels' (fp8kernels.scaling), named here for the rest of the tool.
from fp8kernels.scaling import BLOCK, FP8_DIM_MULTIPLE, Activation, Granularity  # noqa: F401


# What a user may type for --granularity: the granularities plus aliases and `all`.
GRANULARITY_CHOICES: dict[str, tuple[Granularity, ...]] = {
    "tensorwise": (Granularity.TENSORWISE,),
    "axiswise": (Granularity.AXISWISE,),
    "rowwise": (Granularity.AXISWISE,),
    "blockwise": (Granularity.BLOCKWISE,),
    "all": Granularity.fp8(),
}


class FastAccum(str, enum.Enum):
    """Whether the FP8 GEMM accumulates without periodic FP32 promotion."""

    ON = "on"
    OFF = "off"
    NA = "n/a"  # the BF16 reference


class OperandDtypes(str, enum.Enum):
    """The FP8 dtypes of a GEMM's operands (a, b): e4m3 both, or an e5m2 gradient times an e4m3 weight or
    activation (the backward products of TE's HYBRID format; cuBLAS's rowwise kernels take e5m2 first only)."""

    E4M3 = "e4m3"
    E5M2_E4M3 = "e5m2xe4m3"

    @property
    def pair(self) -> tuple[str, str]:
        """(a's, b's) dtype: fp8bench.nn.recipes.Fp8Dtype values."""
        return ("e5m2", "e4m3") if self is OperandDtypes.E5M2_E4M3 else ("e4m3", "e4m3")


OPERAND_DTYPE_CHOICES: dict[str, tuple[OperandDtypes, ...]] = {
    **{d.value: (d,) for d in OperandDtypes},
    "all": tuple(OperandDtypes),
}

FAST_ACCUM_CHOICES: dict[str, tuple[FastAccum, ...]] = {
    "on": (FastAccum.ON,),
    "off": (FastAccum.OFF,),
    "both": (FastAccum.ON, FastAccum.OFF),
}


class Status(str, enum.Enum):
    OK = "ok"
    UNSUPPORTED = "unsupported"
    FAILED = "failed"


def parse_choice(value: str, choices: dict[str, tuple], what: str) -> tuple:
    """Map a user-typed name onto its meaning, or raise ValueError listing the valid names."""
    try:
        return choices[value.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown {what} {value!r}; choose one of: {', '.join(choices)}") from None


@dataclass(frozen=True)
class GemmShape:
    """One matrix product out[M, N] = a[M, K] @ b[K, N], with a name saying where it comes from."""

    M: int
    K: int
    N: int
    name: str = ""

    def __post_init__(self) -> None:
        for dim in ("M", "K", "N"):
            value = getattr(self, dim)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{dim} must be a positive integer, got {value!r}")
        if not self.name:
            object.__setattr__(self, "name", f"{self.M}x{self.K}x{self.N}")

    @property
    def flops(self) -> int:
        return 2 * self.M * self.K * self.N


def fp8_shape_problem(shape: GemmShape, granularity: Granularity) -> str | None:
    """Why an FP8 tensor-core GEMM of this granularity cannot multiply at this shape (a rule of the
    hardware every FP8 GEMM shares, cuBLAS and ours), or None; the BF16 reference has none."""
    if granularity is Granularity.NONE:
        return None
    odd = [f"{d}={getattr(shape, d)}" for d in ("K", "N") if getattr(shape, d) % FP8_DIM_MULTIPLE]
    if odd:
        return f"FP8 GEMMs need K and N to be multiples of {FP8_DIM_MULTIPLE} ({', '.join(odd)})"
    if granularity is Granularity.BLOCKWISE:
        odd = [f"{d}={getattr(shape, d)}" for d in ("K", "N") if getattr(shape, d) % BLOCK]
        if odd:
            return f"blockwise scaling needs K and N to be multiples of {BLOCK} ({', '.join(odd)})"
    return None


@dataclass(frozen=True)
class MatmulCase:
    """One measurement: a shape, a backend and how it scales."""

    shape: GemmShape
    backend: str
    granularity: Granularity
    fast_accum: FastAccum
    dtypes: OperandDtypes = OperandDtypes.E4M3  # the FP8 operands' (the BF16 reference has none)

    def __post_init__(self) -> None:
        if (self.granularity is Granularity.NONE) != (self.fast_accum is FastAccum.NA):
            raise ValueError("the BF16 reference has no fast-accumulation setting and FP8 cases need one")


@dataclass(frozen=True)
class TimingConfig:
    """How hard the harness works for each case (see fp8bench.harness.timing)."""

    repeats: int = 5
    # Before the first repeat: long enough for SM clock and power draw to reach their loaded steady
    # state (an H100 at 700 W drops from 1980 MHz to ~1300 MHz under large FP8 GEMMs).
    settle_ms: float = 200.0
    warmup_ms: float = 25.0  # per repeat, run and discarded (the repeat before it left the GPU busy)
    samples_ms: float = 50.0  # per repeat: how long its flushed samples run, which decides their count
    # Under its power cap an H100 swings its SM clock by up to 30% with a period near one second (the
    # trace in docs/timing.md): a 100 ms repeat samples one phase of that swing. When a clock read
    # during the settle is below `throttled_below` of the GPU's maximum, each repeat runs `throttled_samples_ms` instead.
    # 800 ms: in that trace, three consecutive 0.8 s windows spread at most 1.4% (1 s: 1.0%; 0.7 s: 1.6%;
    # 0.5 s: 2.5%), inside `stable_spread_pct`, at 80% of the time a capped case costs with 1 s.
    throttled_samples_ms: float = 800.0
    throttled_below: float = 0.9
    # Stop on a stable window (fp8bench.harness.timing): while the last `repeats` spread more than this, take
    # another repeat and drop the oldest, at most `max_dropped_repeats` times.
    stable_spread_pct: float = 1.5
    max_dropped_repeats: int = 5
    # Stop early on convergence, as nvbench does at its 0.5% noise default: once `min_repeats` repeats
    # spread at most `converged_spread_pct`, more repeats would not change the median beyond that. On the
    # committed H100 runs the median of the first three such repeats was within 0.9% of all five's, and a
    # capped case costs two long repeats less.
    min_repeats: int = 3
    converged_spread_pct: float = 0.5
    wall_ms_budget: float = 100.0  # host-timed calls for wall_ms (fp8bench.harness.timing.WALL_MIN_CALLS .. MAX)
    min_samples: int = 5
    max_samples: int = 5000
    flush_l2: bool = True

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError("repeats must be at least 1")
        if not 1 <= self.min_samples <= self.max_samples:
            raise ValueError("need 1 <= min_samples <= max_samples")
        if self.settle_ms < 0 or self.warmup_ms < 0 or self.samples_ms <= 0 or self.throttled_samples_ms <= 0:
            raise ValueError("settle and warm-up must be >= 0 ms and the sample budgets > 0 ms")
        if self.wall_ms_budget <= 0:
            raise ValueError("wall_ms_budget must be > 0 ms")
        if self.stable_spread_pct < 0 or self.max_dropped_repeats < 0 or self.converged_spread_pct < 0:
            raise ValueError("stable_spread_pct, converged_spread_pct and max_dropped_repeats must be >= 0")
        if self.min_repeats < 2:
            raise ValueError("min_repeats must be at least 2: one repeat has no spread to converge on")
        if not 0 < self.throttled_below <= 1:
            raise ValueError("throttled_below is a fraction of the maximum SM clock, in (0, 1]")


@dataclass(frozen=True)
class MatmulConfig:
    """Everything `fp8bench matmul` was asked to do."""

    shapes: tuple[GemmShape, ...]
    granularities: tuple[Granularity, ...]
    backends: tuple[str, ...]
    fast_accum: tuple[FastAccum, ...]
    timing: TimingConfig = field(default_factory=TimingConfig)
    dtypes: tuple[OperandDtypes, ...] = (OperandDtypes.E4M3,)

    def cases(self) -> list[MatmulCase]:
        """Shape-major order, so a report of a shape is complete as soon as its rows are written."""
        out: list[MatmulCase] = []
        for shape in self.shapes:
            out.append(MatmulCase(shape, "bf16", Granularity.NONE, FastAccum.NA))
            for granularity in self.granularities:
                for backend in self.backends:
                    if backend == "bf16":
                        continue
                    for fast_accum in self.fast_accum:
                        out.extend(MatmulCase(shape, backend, granularity, fast_accum, d) for d in self.dtypes)
        return out
