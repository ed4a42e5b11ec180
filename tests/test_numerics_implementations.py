"""`fp8bench numerics` curves per implementation: ours, torchao and TransformerEngine convert the same model
through the backend registry. On this CPU torchao and TE are missing (their curves are unsupported rows);
the registry path itself runs with fake backends, and TE's FP8 primary weights with a fake TE module."""

from __future__ import annotations

import contextlib
import json
import os
import re
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from fp8bench import backends
from fp8bench.backends.base import Backend, Converted, Level
from fp8bench.benchmarks import numerics
from fp8bench.cli import app
from fp8bench.harness.case import Unsupported
from fp8bench.harness.results import RunWriter, load_results
from fp8bench.nn import text_data
from fp8bench.nn.recipes import RECIPES
from fp8kernels import reference

MICRO = numerics.TinyLMConfig(dim=32, layers=1, heads=2, ffn=64)
CONFIG = numerics.TrainConfig(steps=2, batch_size=1, seq_len=16, eval_every=1, eval_batches=1, warmup_steps=1, device="cpu")


def micro() -> nn.Module:
    return numerics.TinyLM(MICRO)


@pytest.fixture(scope="module")
def corpus():
    return text_data.load_stdlib_corpus(max_bytes=1_000_000)


def test_curves_are_named_by_implementation_and_recipe():
    curves = numerics.loss_curves((RECIPES["tensorwise"], RECIPES["blockwise"]), (0, 1), ("triton", "torchao", "te"))
    assert [c.name for c in curves] == [
        "bf16-seed0", "bf16-seed1", "triton-tensorwise-seed0", "triton-blockwise-seed0", "torchao-tensorwise-seed0",
        "torchao-blockwise-seed0", "te-tensorwise-seed0", "te-blockwise-seed0",
    ]  # fmt: skip
    assert [c.implementation for c in curves[:2]] == ["bf16", "bf16"]
    with pytest.raises(ValueError, match="unknown implementation 'nope'"):
        numerics.Curve("x", RECIPES["tensorwise"], implementation="nope")
    with pytest.raises(ValueError, match="runs on implementation triton only"):
        numerics.Curve("x", RECIPES["tensorwise-delayed"], start="scale-1", implementation="te")


def test_missing_libraries_are_unsupported_rows_and_the_run_goes_on(corpus, tmp_path):
    curves = numerics.loss_curves((RECIPES["tensorwise"],), (0,), ("torchao", "te", "triton"))
    with RunWriter(tmp_path, {}) as writer:
        results = numerics.run_loss(micro, "micro", curves, CONFIG, corpus, writer)
    assert [r.status for r in results] == [
        "ok", "unsupported: torchao is not installed", "unsupported: transformer_engine is not installed", "ok"
    ]  # fmt: skip
    rows = load_results(tmp_path)
    assert list(rows["backend"]) == ["bf16", "torchao", "te", "triton"]
    assert rows["rel_err"].isna().tolist() == [False, True, True, False]


class FakeLinear(nn.Linear):
    """What a library's converted linear does here: the plain product, counted."""

    calls = 0

    def forward(self, x):
        FakeLinear.calls += 1
        return super().forward(x)


class FakeBackend(Backend):
    """A MODEL-level backend that swaps the linears `keep` accepts for FakeLinear, lacks blockwise, and
    counts the step context and the after-step calls, as TE's autocast and torchao's FSDP hook are used."""

    name = "torchao"
    levels = frozenset({Level.MODEL})

    def __init__(self):
        self.kept: list[str] = []
        self.contexts = self.after_steps = 0

    def convert_model(self, model, recipe, keep, fp8_all_gather, process_group) -> Converted:
        if recipe.name == "blockwise":
            raise Unsupported("the fake library has no blockwise recipe")
        for name, module in list(model.named_modules()):
            if type(module) is nn.Linear and keep(name):
                fake = FakeLinear(module.in_features, module.out_features, bias=False)
                fake.weight = module.weight
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent), child, fake)
                self.kept.append(name)

        @contextlib.contextmanager
        def context():
            self.contexts += 1
            yield

        def after() -> None:
            self.after_steps += 1

        return Converted(model, step_context=context, after_optimizer_step=after)


def test_a_library_curve_converts_through_the_registry(corpus, tmp_path, monkeypatch):
    fake = FakeBackend()
    monkeypatch.setitem(backends.REGISTRY, "torchao", fake)
    monkeypatch.setattr(numerics, "implementation_problem", lambda curve, device: None)  # the GPU it would need
    curves = numerics.loss_curves((RECIPES["rowwise"], RECIPES["blockwise"]), (0,), ("torchao",))
    with RunWriter(tmp_path, {}) as writer:
        results = numerics.run_loss(micro, "micro", curves, CONFIG, corpus, writer)
    assert [r.status for r in results] == ["ok", "ok", "unsupported: the fake library has no blockwise recipe"]
    assert "output" not in fake.kept and len(fake.kept) == 4  # every block linear, never the LM head
    # Two training steps and two validation passes (eval_every 1) each under the library's context.
    assert fake.contexts == 2 + 2 and fake.after_steps == 2
    assert FakeLinear.calls == 4 * fake.contexts
    rows = load_results(tmp_path)
    assert list(rows["backend"]) == ["bf16", "torchao", "torchao"] and list(rows["recipe"]) == ["bf16", "rowwise", "blockwise"]
    assert json.loads(rows["options"].iloc[1])["curve"] == "torchao-rowwise-seed0"


class FakeFp8Weight:
    """TE's FP8 weight as a parameter: its values cast to e4m3 and back, the high-precision init value kept
    until cleared."""

    @staticmethod
    def make(hp: torch.Tensor) -> nn.Parameter:
        q, scale = reference.quantize_tensorwise(hp, reference.E4M3)
        weight = nn.Parameter(reference.dequantize(q, scale))
        weight.hp = hp.clone()
        weight.get_high_precision_init_val = lambda: weight.hp
        weight.dequantize = lambda: weight.detach().clone()

        def clear() -> None:
            weight.hp = None

        weight.clear_high_precision_init_val = clear
        return weight


def fake_te(inits: list) -> SimpleNamespace:
    """A transformer_engine.pytorch with fp8_model_init(preserve_high_precision_init_val) and a Linear whose
    weight is FakeFp8Weight when made under it."""
    state = {"fp8": False}

    @contextlib.contextmanager
    def fp8_model_init(enabled: bool = True, preserve_high_precision_init_val: bool = False):
        inits.append(preserve_high_precision_init_val)
        state["fp8"] = enabled
        yield
        state["fp8"] = False

    class Linear(nn.Module):
        def __init__(self, in_features, out_features, bias=False, params_dtype=None, device=None):
            super().__init__()
            hp = torch.randn(out_features, in_features, dtype=params_dtype, device=device) * 0.02
            self.weight = FakeFp8Weight.make(hp) if state["fp8"] else nn.Parameter(hp)

        def forward(self, x):
            return F.linear(x, self.weight.to(x.dtype))

    return SimpleNamespace(fp8_model_init=fp8_model_init, Linear=Linear, __version__="fake")


@pytest.mark.parametrize("start", ["master-from-hp", "master-from-fp8"])
def test_te_fp8_primary_weights_train_their_fp32_masters(corpus, tmp_path, monkeypatch, start):
    from fp8bench.backends import te as te_backend

    inits: list = []
    monkeypatch.setattr(te_backend, "te_module", lambda: fake_te(inits))
    monkeypatch.setattr(te_backend.TeBackend, "convert_model", lambda self, model, recipe, keep, *rest: Converted(model, options={"te_recipe": "fake"}))
    curve = numerics.Curve(f"te-{start}", RECIPES["tensorwise-delayed"], start=start, implementation="te")
    trainable = numerics.build_model(micro, curve, "cpu")
    assert inits == [True]  # built under fp8_model_init(preserve_high_precision_init_val=True)
    fp8_weights = [m.weight for m in trainable.model.modules() if hasattr(getattr(m, "weight", None), "clear_high_precision_init_val")]
    assert len(fp8_weights) == 4 and type(trainable.model.output) is nn.Linear
    masters = trainable.parameters[-4:]
    assert not any(w is p for w in fp8_weights for p in trainable.parameters)  # the optimizer updates the masters
    for weight, master in zip(fp8_weights, masters):
        assert master.dtype == torch.float32 and weight.hp is None  # the init value cleared once copied
        if start == "master-from-fp8":
            assert torch.equal(master, weight.detach())
        else:
            assert not torch.equal(master, weight.detach())
            q, scale = reference.quantize_tensorwise(master.detach(), reference.E4M3)
            assert torch.equal(reference.dequantize(q, scale), weight.detach())  # the FP8 weight is its master cast
    # Training: the FP8 weights' gradients update the masters, and the weights follow them after each step.
    writer = numerics.CurveWriter(tmp_path)
    monkeypatch.setattr(numerics, "build_model", lambda factory, c, device: trainable)
    losses = numerics.train_curve(micro, curve, CONFIG, corpus, writer)
    writer.close()
    assert len(losses) == 2
    for weight, master in zip(fp8_weights, masters):
        assert torch.equal(weight.detach(), master.detach()) and weight.grad is None


def test_te_without_high_precision_init_is_unsupported(monkeypatch):
    te = SimpleNamespace(fp8_model_init=lambda enabled=True: contextlib.nullcontext(), __version__="1.0")
    with pytest.raises(Unsupported, match=r"transformer_engine 1.0 has no fp8_model_init\(preserve_high_precision_init_val"):
        numerics.te_model_init(te)


def test_cli_implementation_option(tmp_path, monkeypatch):
    monkeypatch.setitem(numerics.MODELS, "micro", micro)
    out = tmp_path / "run"
    args = ["numerics", "loss", "--model", "micro", "--recipe", "tensorwise", "--implementation", "triton", "--implementation", "te",
            "--steps", "2", "--batch-size", "1", "--seq-len", "16", "--bf16-seeds", "1", "--corpus-bytes", "1000000", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "3 curves of 2 steps" in result.output and "left about" in result.output  # the per-curve progress with its estimate
    assert re.search(r"triton-tensorwise-seed0 +about \d+ s for 2 steps at the rate of its first 2", result.output), result.output
    assert list(load_results(out)["status"]) == ["ok", "ok", "unsupported: transformer_engine is not installed"]
    result = CliRunner().invoke(app, ["numerics", "loss", "--implementation", "cublas", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "unknown implementation 'cublas'" in result.output, result.output


def test_model_help_lists_the_models_of_the_code():
    result = CliRunner().invoke(app, ["numerics", "loss", "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert f"the model to train: {' | '.join(numerics.MODELS)}" in result.output and "[default: llama-25m]" in result.output
