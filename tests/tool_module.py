"""Load a script of tools/ as a module for its tests."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import torch


def load_tool(name: str) -> ModuleType:
    """tools/<name>.py as the module `name`. Without a GPU, TRITON_INTERPRET=1 is set first: a tool that imports
    Triton's language module before it would leave the kernel tests collected after it with Triton's functions
    compiled for a GPU."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
