"""Autotuned FP8 GEMM configs with a persistent cache: where the heuristic (fp8kernels.gemm_configs) has not been
measured on a shape, time its regime's candidate configs on this GPU once and keep the fastest.

    FP8KERNELS_GEMM_AUTOTUNE=1         fp8_gemm, given no config, takes the tuned one (tuning it on first use)
    FP8KERNELS_GEMM_TUNE_CACHE=DIR     where the cache files live (default ~/.cache/fp8kernels)

One JSON file per GPU model (`gemm-<model>.json`), keyed by the problem: M, N, K, granularity, fast
accumulation, the rows per blockwise weight scale and the operand dtypes. Each entry holds the chosen config
(Fp8GemmConfig fields) and every candidate's median milliseconds, so a later look shows what it was chosen
over. Candidates (tuning_candidates): the heuristic's pick first, then the regime's tiles and candidate_configs
of the Gluon kernel where it runs, each that splits its last wave also whole; a candidate that fails to compile
or launch is left out. Where the Gluon kernel does not run, the heuristic's config is the only one: nothing is
timed or cached. Each is timed from a CUDA graph (median_ms) on the caller's operands, so tuning costs a
few seconds per new problem; later calls and processes read the cache. Writes are atomic (a whole file
replaced), and entries other processes added since the file was read are kept.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from fp8kernels.gemm_configs import (
    DeviceProperties,
    Fp8GemmConfig,
    candidate_configs,
    choose_config,
    config_label,
    fit_shared_memory,
    gluon_tiles,
    last_wave_split,
)
from fp8kernels.scaling import Granularity

AUTOTUNE_ENV = "FP8KERNELS_GEMM_AUTOTUNE"
CACHE_ENV = "FP8KERNELS_GEMM_TUNE_CACHE"
# The configs this process has taken, by (cache file, problem): fp8_gemm asks on every launch, and a launch's
# host time counts where the GPU waits for it, so the cache file is read once per problem, not per call.
_TAKEN: dict[tuple[Path, str], Fp8GemmConfig] = {}


def autotune_enabled() -> bool:
    return os.environ.get(AUTOTUNE_ENV) == "1"


def problem_key(M: int, N: int, K: int, granularity: Granularity, fast_accum: bool, b_rows: int, a_dtype: torch.dtype,
                b_dtype: torch.dtype) -> str:
    dtypes = "x".join(str(d).removeprefix("torch.") for d in (a_dtype, b_dtype))
    return f"{M}x{N}x{K}/{granularity.value}/fast_accum={'on' if fast_accum else 'off'}/b_rows={b_rows}/{dtypes}"


class Problem(NamedTuple):
    """What problem_key spells, read back (the operand dtypes left out)."""

    M: int
    N: int
    K: int
    granularity: Granularity
    fast_accum: bool
    b_rows: int


def problem_of(key: str) -> Problem:
    """The problem a problem_key names."""
    sizes, granularity, fast_accum, b_rows, _ = key.split("/")
    M, N, K = (int(size) for size in sizes.split("x"))
    return Problem(M, N, K, Granularity(granularity), fast_accum == "fast_accum=on", int(b_rows.removeprefix("b_rows=")))


def cache_path(device_name: str) -> Path:
    folder = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "fp8kernels")
    return folder / f"gemm-{re.sub(r'[^A-Za-z0-9]+', '-', device_name).strip('-').lower()}.json"


class TuneCache:
    """The tuned configs of one GPU model, in `path`."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def read(self) -> dict[str, dict]:
        """Every entry; {} where there is no file. ValueError naming the file where it is not a JSON object of
        entries, each with a `config` object."""
        if not self.path.exists():
            return {}
        try:
            entries = json.loads(self.path.read_text())
        except (UnicodeDecodeError, ValueError) as err:
            raise ValueError(f"{self.path}: not a GEMM tuning cache ({err}); delete it or point {CACHE_ENV} elsewhere") from None
        if not isinstance(entries, dict) or not all(isinstance(e, dict) and isinstance(e.get("config"), dict)
                                                    for e in entries.values()):
            raise ValueError(f"{self.path}: not a GEMM tuning cache (a JSON object of entries with a `config`); "
                             f"delete it or point {CACHE_ENV} elsewhere")
        return entries

    def config(self, key: str) -> Fp8GemmConfig | None:
        entry = self.read().get(key)
        if entry is None:
            return None
        try:
            return Fp8GemmConfig(**entry["config"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"{self.path}: entry {key!r} is not an Fp8GemmConfig ({err})") from None

    def store(self, key: str, config: Fp8GemmConfig, candidate_ms: dict[str, float]) -> None:
        """Add an entry: the file is read again and replaced whole, so entries written meanwhile stay."""
        self._write(self.read() | {key: {"config": config.as_dict(), "candidate_ms": candidate_ms}})

    def copy_problems(self, products: set[tuple[int, int, int]], path: Path) -> int:
        """Write the entries of these (M, N, K) products to `path` (a cache file of their own, e.g. beside a
        run's results: what was chosen over what); the number written, nothing written where none."""
        entries = {key: entry for key, entry in self.read().items() if problem_of(key)[:3] in products}
        if entries:
            TuneCache(path)._write(entries)
        return len(entries)

    def _write(self, entries: dict[str, dict]) -> None:
        """Replace the file whole (a partial file renamed over it)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=self.path.parent, prefix=self.path.name, suffix=".tmp",
                                         delete=False) as partial:
            json.dump(entries, partial, indent=1, sort_keys=True)
        os.replace(partial.name, self.path)


def tuning_candidates(M: int, N: int, K: int, granularity: Granularity, fast_accum: bool, device: DeviceProperties,
                      gluon: bool, b_rows: int) -> list[Fp8GemmConfig]:
    """What the tuner times (and tools/gemm_awkward_probe.py), the heuristic's pick first: where the Gluon kernel
    runs, the regime's tiles (GLUON_TILES) and its candidate_configs, each one that would split its last wave along
    K also whole (the probes found the split slower than the model on products of few tiles:
    gemm_configs.SPLIT_ALONE_SPEED); elsewhere the heuristic's alone."""
    heuristic = choose_config(M, N, K, granularity, fast_accum, device, gluon, b_rows)
    if not gluon:
        return [heuristic]
    tiles = [fit_shared_memory(tile.with_sms(device.multiprocessor_count), device)
             for tile, _ in gluon_tiles(granularity, fast_accum, b_rows)]
    configs = [heuristic, *tiles, *(c for c in candidate_configs(granularity, fast_accum, device, b_rows) if c.gluon_ws)]
    whole = [dataclasses.replace(c, split_last_wave=False) for c in configs if last_wave_split(M, N, K, c)[0]]
    return list(dict.fromkeys(configs + whole))


@functools.cache
def _l2_flush_buffer(device_index: int) -> torch.Tensor:
    """A buffer several times L2 (at least 256 MiB), rewritten before each timed launch."""
    l2_bytes = torch.cuda.get_device_properties(device_index).L2_cache_size
    return torch.empty(max(256 * 2**20, 4 * l2_bytes) // 4, dtype=torch.int32, device=f"cuda:{device_index}")


def median_ms(config: Fp8GemmConfig, run: Callable[[], object]) -> float:
    """`run`'s GPU milliseconds from a cold L2, `run` being `config`'s launch: launches each after an L2 flush,
    replayed from a CUDA graph (triton.testing.do_bench_cudagraph, median), less the flushes alone. The graph
    leaves the host's launch time out: timed by events around single launches (triton.testing.do_bench), 0.1 ms
    products measured the Python launch path, and the picks ran up to 2x slower than the heuristic's configs.
    The flush matches fp8bench's timing (each sample from a cold L2): timed without it, where a few MB of weights
    stay in L2 between launches, 14 of the 25 picks that differed from the heuristic's ran 1% or more slower than
    it in fp8bench (down to 0.91x), 9 faster (reports/h100-sxm/matmul-moe-tuned)."""
    from triton.testing import do_bench_cudagraph

    flush = _l2_flush_buffer(torch.cuda.current_device()).bitwise_not_

    def flushed_run():
        flush()
        run()

    return do_bench_cudagraph(flushed_run, return_mode="median") - _flush_ms(torch.cuda.current_device())


@functools.cache
def _flush_ms(device_index: int) -> float:
    """The L2 flush's own milliseconds, timed as median_ms times launches, once per device: the same for every
    candidate, it ranks none, only makes their times the launches' own."""
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(_l2_flush_buffer(device_index).bitwise_not_, return_mode="median")


def autotuned_config(a: torch.Tensor, b_t: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                     granularity: Granularity, fast_accum: bool, *, cache: TuneCache | None = None,
                     timer: Callable[[Fp8GemmConfig, Callable[[], object]], float] = median_ms) -> Fp8GemmConfig:
    """The cached config of this problem on this GPU model, or, the first time, the fastest candidate timed
    by `timer` on these operands (then cached). Operands as fp8kernels.gemm.fp8_gemm takes them, checked. Each
    problem's config is looked up once per process (_TAKEN)."""
    from fp8kernels.gemm import weight_scale_rows

    M, K = a.shape
    N = b_t.shape[0]
    b_rows = weight_scale_rows(granularity, scale_b, N)
    key = problem_key(M, N, K, granularity, fast_accum, b_rows, a.dtype, b_t.dtype)
    cache = cache or TuneCache(cache_path(torch.cuda.get_device_name(a.device) if a.is_cuda else "cpu"))
    taken = _TAKEN.get((cache.path, key))
    if taken is None:
        taken = _TAKEN[(cache.path, key)] = cache.config(key) or _tuned(a, b_t, scale_a, scale_b, granularity, fast_accum,
                                                                          b_rows, key, cache, timer)
    return taken


def _tuned(a, b_t, scale_a, scale_b, granularity: Granularity, fast_accum: bool, b_rows: int, key: str,
           cache: TuneCache, timer) -> Fp8GemmConfig:
    """The fastest candidate on these operands, stored in `cache` under `key`; the heuristic's config untimed
    where it is the only candidate, or where none ran."""
    from fp8kernels.gemm import device_properties, fp8_gemm, gluon_runs_on

    M, K = a.shape
    N = b_t.shape[0]
    candidates = tuning_candidates(M, N, K, granularity, fast_accum, device_properties(a.device), gluon_runs_on(a.device),
                                   b_rows)
    heuristic = candidates[0]
    if len(candidates) == 1:
        return heuristic
    out = torch.empty((M, N), dtype=torch.bfloat16, device=a.device)
    timed: dict[Fp8GemmConfig, float] = {}
    for config in candidates:
        run = lambda config=config: fp8_gemm(a, b_t, scale_a, scale_b, granularity=granularity,  # noqa: E731
                                             fast_accum=fast_accum, config=config, out=out)
        try:
            timed[config] = timer(config, run)
        except Exception:  # noqa: BLE001 (a candidate that cannot compile or launch here is not a choice)
            continue
    if not timed:
        return heuristic
    best = min(timed, key=timed.get)
    cache.store(key, best, {config_label(c.options_for(M, N, K)): round(ms, 5) for c, ms in timed.items()})
    return best

