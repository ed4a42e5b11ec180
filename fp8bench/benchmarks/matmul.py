"""`fp8bench matmul`: one FP8 GEMM per backend against the BF16 product, shape by shape.

Each shape's BF16 reference is measured first, so every FP8 row carries its speedup over the BF16
product measured in the same run on the same inputs. Rows go to the CSV as each case finishes.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from fp8bench.backends import Operands, Unsupported, get_backend
from fp8bench.config import FastAccum, GemmShape, Granularity, MatmulCase, MatmulConfig, Status
from fp8bench.model.hardware import GpuSpec
from fp8bench.harness.results import Row, RunWriter, measurement_values, status_text
from fp8bench.harness.timing import Measurement, TimerChoice

# e4m3 keeps 3 mantissa bits: on normal random operands an FP8 product lands ~4% (relative Frobenius)
# from the bf16 product, whatever the scaling. Far beyond that, the kernel computed something else.
WRONG_RESULT_REL_ERR = 0.1


def random_operands(shape: GemmShape, seed: int = 0) -> Operands:
    """Normal random BF16 operands (never zeros: they run faster than real data and hide bugs)."""
    import torch

    generator = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(shape.M, shape.K, device="cuda", dtype=torch.bfloat16, generator=generator)
    b_t = torch.randn(shape.N, shape.K, device="cuda", dtype=torch.bfloat16, generator=generator)
    return Operands(a, b_t)


def case_row(case: MatmulCase, status: str, options: dict | None = None) -> Row:
    shape = case.shape
    return Row(
        {
            "benchmark": "matmul",
            "case": shape.name,
            "M": shape.M,
            "K": shape.K,
            "N": shape.N,
            "granularity": case.granularity.value,
            "backend": case.backend,
            "recipe": "bf16" if case.granularity is Granularity.NONE else f"e4m3-{case.granularity.value}",
            "fast_accum": case.fast_accum.value,
            "options": json.dumps(options or {}, sort_keys=True),
            "status": status,
        }
    )


def measured_row(
    case: MatmulCase,
    m: Measurement,
    options: dict,
    gpu: GpuSpec | None,
    bf16_ms: float | None,
    rel_err: float | None,
) -> Row:
    row = case_row(case, status_text(Status.OK), options)
    tflops = case.shape.flops / (m.median_ms * 1e-3) / 1e12
    fp8 = case.granularity is not Granularity.NONE
    row.values.update(
        measurement_values(m),
        tflops=tflops,
        pct_peak=100.0 * tflops / gpu.peak_tflops(fp8) if gpu else None,
        speedup_vs_bf16=bf16_ms / m.median_ms if bf16_ms else None,
        rel_err=rel_err,
    )
    return row


def _relative_error(out, ref) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def expected_rows(config: MatmulConfig) -> dict[str, set[tuple[str, ...]]]:
    """Per shape, the (case, backend, granularity, fast_accum) of its rows: what a finished shape holds."""
    expected: dict[str, set[tuple[str, ...]]] = {}
    for case in config.cases():
        expected.setdefault(case.shape.name, set()).add(
            (case.shape.name, case.backend, case.granularity.value, case.fast_accum.value)
        )
    return expected


def run_matmul(
    config: MatmulConfig,
    writer: RunWriter,
    gpu: GpuSpec | None,
    timer_choice: str = "auto",
    on_row: Callable[[Row], None] = lambda row: None,
) -> list[Row]:
    """Measure every case of `config`, appending each row to `writer` as it finishes."""
    import torch

    timers = TimerChoice(timer_choice, config.timing.flush_l2)
    rows: list[Row] = []

    def emit(row: Row) -> None:
        writer.append(row)
        rows.append(row)
        on_row(row)

    cases_by_shape: dict[GemmShape, list[MatmulCase]] = {}
    for case in config.cases():
        cases_by_shape.setdefault(case.shape, []).append(case)

    for shape, cases in cases_by_shape.items():
        try:
            operands = random_operands(shape)
        except torch.cuda.OutOfMemoryError:
            for case in cases:
                emit(case_row(case, status_text(Status.FAILED, "out of memory allocating the operands")))
            torch.cuda.empty_cache()
            continue
        bf16_ms: float | None = None
        bf16_out = None
        for case in cases:
            row = _run_case(case, operands, config, timers, gpu, bf16_ms, bf16_out)
            if case.granularity is Granularity.NONE and row.values["status"] == "ok":
                bf16_ms = row.values["median_ms"]
                bf16_out = get_backend("bf16").prepare_gemm(operands, Granularity.NONE, FastAccum.NA).run()
            emit(row)
        del operands, bf16_out
        torch.cuda.empty_cache()
    return rows


def _run_case(case, operands, config, timers, gpu, bf16_ms, bf16_out) -> Row:
    import torch

    backend = get_backend(case.backend)
    reason = backend.unavailable_reason() or backend.unsupported_reason(case.shape, case.granularity, case.fast_accum)
    if reason:
        return case_row(case, status_text(Status.UNSUPPORTED, reason))
    try:
        prepared = backend.prepare_gemm(operands, case.granularity, case.fast_accum)
        measurement = timers.measure(prepared.run, config.timing)
        rel_err = _relative_error(prepared.run(), bf16_out) if bf16_out is not None else None
        row = measured_row(case, measurement, prepared.options, gpu, bf16_ms, rel_err)
        if rel_err is not None and rel_err > WRONG_RESULT_REL_ERR:
            row.values["status"] = status_text(
                Status.FAILED, f"wrong result: {rel_err:.3g} relative error vs the bf16 product (> {WRONG_RESULT_REL_ERR})"
            )
        return row
    except Unsupported as err:
        return case_row(case, status_text(Status.UNSUPPORTED, str(err)))
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return case_row(case, status_text(Status.FAILED, "out of memory"))
    except Exception as err:  # noqa: BLE001 - one broken case must not end the run; its row says why
        first_line = (str(err).strip().splitlines() or [""])[0]
        return case_row(case, status_text(Status.FAILED, f"{type(err).__name__}: {first_line}"[:200]))
