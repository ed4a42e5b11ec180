"""fp8kernels.gemm_autotune: the tuned config per problem and GPU model, its persistent cache, and fp8_gemm taking
it under FP8KERNELS_GEMM_AUTOTUNE=1. On the CPU a stand-in timer ranks the candidates (the kernels run under the
interpreter, whose times mean nothing); the GPU test times them for real."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: Triton reads it then

from fp8bench.backends import Operands  # noqa: E402
from fp8bench.backends.triton import kernel_operands  # noqa: E402
from fp8kernels import gemm as gemm_module  # noqa: E402
from fp8kernels import reference as ref  # noqa: E402
from fp8kernels.gemm_autotune import (  # noqa: E402
    AUTOTUNE_ENV,
    CACHE_ENV,
    TuneCache,
    autotuned_config,
    cache_path,
    problem_key,
    problem_of,
    tuning_candidates,
)
from fp8kernels.gemm_configs import DeviceProperties, Fp8GemmConfig, config_label, last_wave_split  # noqa: E402
from fp8kernels.scaling import Granularity  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"


def _operands(M: int, K: int, N: int, granularity: Granularity, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    a, b_t = (torch.randn(rows, K, generator=generator).to(torch.bfloat16) for rows in (M, N))
    return tuple(x.to(DEVICE) for x in kernel_operands(Operands(a, b_t), granularity))


class RankByStages:
    """A stand-in timer: a config's 'milliseconds' fall with its stages and rise with block_n, so the
    fastest is known; records each config it was asked about, and never runs a kernel."""

    def __init__(self, failing: Fp8GemmConfig | None = None):
        self.asked: list[Fp8GemmConfig] = []
        self.failing = failing

    def __call__(self, config: Fp8GemmConfig, run) -> float:
        self.asked.append(config)
        if config == self.failing:
            raise RuntimeError("out of resources: shared memory")
        return self.ms(config)

    @staticmethod
    def ms(config: Fp8GemmConfig) -> float:
        return 1.0 / config.num_stages + config.block_n / 1000 + (0.5 if config.overlap_promotion else 0.0)


@pytest.fixture
def gluon_candidates(monkeypatch):
    """The candidates of a GPU with the Gluon kernel (the tuner's choices; the stand-in timer runs none)."""
    monkeypatch.setattr(gemm_module, "gluon_runs_on", lambda device: True)


def test_the_fastest_candidate_is_cached_and_read_back_without_timing_again(tmp_path, gluon_candidates):
    operands = _operands(64, 256, 128, Granularity.TENSORWISE)
    cache = TuneCache(tmp_path / "gemm-test.json")
    timer = RankByStages()
    chosen = autotuned_config(*operands, Granularity.TENSORWISE, False, cache=cache, timer=timer)
    assert len(timer.asked) > 3 and len(set(timer.asked)) == len(timer.asked)  # each candidate once
    assert chosen == min(timer.asked, key=RankByStages.ms)
    entry = json.loads((tmp_path / "gemm-test.json").read_text())[
        problem_key(64, 128, 256, Granularity.TENSORWISE, False, 128, torch.float8_e4m3fn, torch.float8_e4m3fn)]
    assert Fp8GemmConfig(**entry["config"]) == chosen
    assert len(entry["candidate_ms"]) == len(set(config_label(c.options_for(64, 128, 256)) for c in timer.asked))
    again = RankByStages()
    assert autotuned_config(*operands, Granularity.TENSORWISE, False, cache=cache, timer=again) == chosen
    assert again.asked == []
    # Read once per process: fp8_gemm asks on every launch, which must not read the file each time.
    (tmp_path / "gemm-test.json").unlink()
    assert autotuned_config(*operands, Granularity.TENSORWISE, False, cache=cache, timer=again) == chosen
    assert again.asked == [] and not (tmp_path / "gemm-test.json").exists()


def test_a_candidate_that_fails_is_left_out_and_problems_are_kept_apart(tmp_path, gluon_candidates):
    cache = TuneCache(tmp_path / "gemm-test.json")
    first = RankByStages()
    best = autotuned_config(*_operands(64, 256, 128, Granularity.AXISWISE), Granularity.AXISWISE, True, cache=cache,
                            timer=first)
    failing = RankByStages(failing=best)
    # Another problem (fast accumulation off) is tuned anew; its fastest candidate fails, so the next one is kept.
    second = autotuned_config(*_operands(64, 256, 128, Granularity.AXISWISE), Granularity.AXISWISE, False, cache=cache,
                              timer=failing)
    assert best in failing.asked and second != best
    assert len(cache.read()) == 2


def test_a_store_keeps_the_entries_another_process_wrote_meanwhile(tmp_path):
    path = tmp_path / "gemm-test.json"
    ours, theirs = TuneCache(path), TuneCache(path)
    config = Fp8GemmConfig(block_m=64, block_n=64, block_k=64, group_m=8, num_stages=2, num_warps=4, num_sms=4)
    ours.read()
    theirs.store("theirs", config, {"x": 1.0})
    ours.store("ours", config, {"x": 2.0})
    assert set(TuneCache(path).read()) == {"theirs", "ours"}
    assert [p.name for p in tmp_path.iterdir()] == ["gemm-test.json"]  # no partial file left behind


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"k": {"no_config": 1}}', '{"k": {"config": {"block_q": 1}}}'])
def test_a_malformed_cache_is_named_in_the_error(tmp_path, text):
    path = tmp_path / "gemm-test.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=str(path)):
        TuneCache(path).config("k")


def test_fp8_gemm_takes_the_tuned_config_when_asked_to(tmp_path, monkeypatch):
    """FP8KERNELS_GEMM_AUTOTUNE=1: a cached config for the problem is launched and the product is right; without
    the variable the heuristic's is."""
    operands = _operands(64, 256, 128, Granularity.TENSORWISE, seed=3)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    device_name = torch.cuda.get_device_name() if HAS_CUDA else "cpu"
    tuned = Fp8GemmConfig(block_m=64, block_n=64, block_k=64, group_m=8, num_stages=2, num_warps=4, num_sms=2)
    TuneCache(cache_path(device_name)).store(
        problem_key(64, 128, 256, Granularity.TENSORWISE, False, 128, torch.float8_e4m3fn, torch.float8_e4m3fn),
        tuned, {config_label(tuned.as_dict()): 1.0})
    launched = []
    launch = gemm_module.launch_kernel
    monkeypatch.setattr(gemm_module, "launch_kernel", lambda *args: launched.append(args[7]) or launch(*args))
    monkeypatch.setenv(AUTOTUNE_ENV, "1")
    out = gemm_module.fp8_gemm(*operands, granularity="tensorwise")
    assert launched == [tuned]
    qa, qb_t, sa, sb = (x.cpu() for x in operands)
    expected = ref.dequantize(qa, sa) @ ref.dequantize(qb_t, sb).t()
    assert ((out.float().cpu() - expected).norm() / expected.norm()).item() < 1e-2
    monkeypatch.delenv(AUTOTUNE_ENV)
    gemm_module.fp8_gemm(*operands, granularity="tensorwise")
    assert launched[1] == gemm_module.gemm_config(64, 128, 256, "tensorwise", False, qa.device if not HAS_CUDA
                                                  else torch.device("cuda"))


def test_the_candidates_include_each_split_config_whole_and_only_the_heuristic_without_gluon():
    """Mixtral's expert w2 at 512 tokens on an H100: the candidates that split their last wave (128 x 256: 64
    tiles, each in two K pieces) are timed whole too; where the Gluon kernel does not run, the heuristic's config
    alone."""
    h100 = DeviceProperties(multiprocessor_count=132, shared_memory_per_program=227 * 1024)
    candidates = tuning_candidates(512, 4096, 14336, Granularity.TENSORWISE, True, h100, True, 128)
    split = [c for c in candidates if last_wave_split(512, 4096, 14336, c)[0]]
    assert split and all(dataclasses.replace(c, split_last_wave=False) in candidates for c in split)
    assert len(set(candidates)) == len(candidates) and all(c.gluon_ws for c in candidates)
    assert tuning_candidates(512, 4096, 14336, Granularity.TENSORWISE, True, h100, False, 128) == [
        gemm_module.choose_config(512, 4096, 14336, Granularity.TENSORWISE, True, h100, False, 128)]


def test_without_the_gluon_kernel_the_heuristic_is_taken_untimed_and_uncached(tmp_path):
    if HAS_CUDA and gemm_module.gluon_runs_on(torch.device("cuda")):
        pytest.skip("the Gluon kernel runs here: the tuner has candidates (the GPU test below)")
    cache = TuneCache(tmp_path / "gemm-test.json")
    timer = RankByStages()
    config = autotuned_config(*_operands(64, 256, 128, Granularity.TENSORWISE), Granularity.TENSORWISE, False,
                              cache=cache, timer=timer)
    assert config == gemm_module.gemm_config(64, 128, 256, "tensorwise", False, torch.device(DEVICE))
    assert timer.asked == [] and not (tmp_path / "gemm-test.json").exists()


def test_the_cache_file_is_named_by_gpu_model_under_the_folder_asked_for(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert cache_path("NVIDIA H100 80GB HBM3") == tmp_path / "gemm-nvidia-h100-80gb-hbm3.json"
    monkeypatch.delenv(CACHE_ENV)
    assert cache_path("NVIDIA H200").parent.name == "fp8kernels"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_autotune_times_the_candidates_and_keeps_a_correct_config(tmp_path):
    operands = _operands(512, 4096, 4096, Granularity.BLOCKWISE, seed=1)
    cache = TuneCache(tmp_path / "gemm-gpu.json")
    config = autotuned_config(*operands, Granularity.BLOCKWISE, False, cache=cache)
    entry = next(iter(cache.read().values()))
    assert len(entry["candidate_ms"]) > 2 and all(ms > 0 for ms in entry["candidate_ms"].values())
    assert min(entry["candidate_ms"].values()) == entry["candidate_ms"][config_label(config.options_for(512, 4096, 4096))]
    out = gemm_module.fp8_gemm(*operands, granularity="blockwise", config=config)
    qa, qb_t, sa, sb = operands
    expected = ref.dequantize(qa.cpu(), sa.cpu()) @ ref.dequantize(qb_t.cpu(), sb.cpu()).t()
    assert ((out.float().cpu() - expected).norm() / expected.norm()).item() < 1e-2


def test_the_tuned_backend_times_the_cached_config_beside_the_heuristic_one(tmp_path, monkeypatch):
    """`triton-tuned` takes the autotuner's config whatever FP8KERNELS_GEMM_AUTOTUNE says, and says so in its
    row's options; `triton` beside it keeps the heuristic's. Both products are right."""
    from fp8bench.backends import get_backend
    from fp8bench.config import FastAccum

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(AUTOTUNE_ENV, raising=False)
    generator = torch.Generator().manual_seed(5)
    a, b_t = (torch.randn(rows, 256, generator=generator).to(torch.bfloat16).to(DEVICE) for rows in (64, 128))
    tuned = Fp8GemmConfig(block_m=64, block_n=64, block_k=64, group_m=8, num_stages=2, num_warps=4, num_sms=2)
    TuneCache(cache_path(torch.cuda.get_device_name() if HAS_CUDA else "cpu")).store(
        problem_key(64, 128, 256, Granularity.TENSORWISE, False, 128, torch.float8_e4m3fn, torch.float8_e4m3fn),
        tuned, {config_label(tuned.as_dict()): 1.0})
    heuristic = gemm_module.gemm_config(64, 128, 256, "tensorwise", False, torch.device(DEVICE))
    assert heuristic != tuned
    expected = (a.float() @ b_t.float().t()).cpu()
    for name, config_from, config in (("triton-tuned", "autotuned", tuned), ("triton", "heuristic", heuristic)):
        prepared = get_backend(name).prepare_gemm(Operands(a, b_t), Granularity.TENSORWISE, FastAccum.OFF)
        assert prepared.options["config_from"] == config_from
        assert prepared.options["block_n"] == config.block_n and prepared.options["num_stages"] == config.num_stages
        out = prepared.run().float().cpu()
        assert ((out - expected).norm() / expected.norm()).item() < 0.05


def test_a_runs_problems_are_copied_out_of_the_cache_beside_its_results(tmp_path):
    cache = TuneCache(tmp_path / "gemm-test.json")
    config = Fp8GemmConfig(block_m=64, block_n=64, block_k=64, group_m=8, num_stages=2, num_warps=4, num_sms=4)
    for M, N, K in ((512, 4096, 14336), (256, 7168, 2048)):
        for fast_accum in (True, False):
            cache.store(problem_key(M, N, K, Granularity.TENSORWISE, fast_accum, 128, torch.float8_e4m3fn,
                                    torch.float8_e4m3fn), config, {"x": 1.0})
    run_copy = tmp_path / "run" / "gemm-tune-cache.json"
    assert cache.copy_problems({(512, 4096, 14336), (4096, 4096, 4096)}, run_copy) == 2
    assert {key.split("/")[0] for key in TuneCache(run_copy).read()} == {"512x4096x14336"}
    assert cache.copy_problems({(4096, 4096, 4096)}, tmp_path / "none.json") == 0
    assert not (tmp_path / "none.json").exists()


def test_a_problem_key_reads_back_as_its_problem():
    key = problem_key(512, 4096, 14336, Granularity.BLOCKWISE, False, 1, torch.float8_e5m2, torch.float8_e4m3fn)
    assert problem_of(key) == (512, 4096, 14336, Granularity.BLOCKWISE, False, 1)
    assert problem_of(problem_key(64, 128, 256, Granularity.AXISWISE, True, 128, torch.float8_e4m3fn,
                                  torch.float8_e4m3fn)).fast_accum is True
