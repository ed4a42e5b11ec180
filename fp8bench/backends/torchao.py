"""`torchao`: torchao.float8's training conversion (convert_to_float8_training with
Float8LinearConfig.from_recipe_name), compiled, for the measured layer and the model level."""

from __future__ import annotations

from fp8bench.backends.base import Backend, Level


def torchao_unavailable_reason() -> str | None:
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return "torchao is not installed"
    return None


class TorchaoBackend(Backend):
    name = "torchao"
    description = "torchao.float8.convert_to_float8_training under torch.compile"
    levels = frozenset({Level.LAYER, Level.MODEL})

    def unavailable_reason(self, level: Level = Level.GEMM) -> str | None:
        return super().unavailable_reason(level) or torchao_unavailable_reason()
