"""Load a script of tools/ as a module for its tests."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import torch


def load_tool(name: str, triton_kernels: bool = False) -> ModuleType:
    """tools/<name>.py as the module `name`, registered in sys.modules (its dataclasses look their module up
    there). `triton_kernels`: the tool imports Triton's language module (our kernels), so without a GPU
    TRITON_INTERPRET=1 is set first; set after, the kernel tests collected later would find Triton's functions
    compiled for a GPU."""
    if triton_kernels and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
