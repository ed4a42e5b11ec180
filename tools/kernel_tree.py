"""Another checkout's `kernels/` loaded beside the installed `fp8kernels`, so that one process can time a kernel
change against the kernels it changes, case by case on the same operands (`gemm_sweep.py compare
--baseline-kernels DIR`). Timed in two runs one after the other, the two kernels meet different clocks under the
power cap and the comparison measures the clocks too (reports/h100-sxm/gemm-epilogue-scales-prefetch).

The copy's modules are the package's own files loaded a second time under the same names. While the copy runs,
they stand in sys.modules in place of the installed ones, because fp8kernels imports some of its modules inside
its functions (the kernel modules, once Triton's mode is known), and those imports must find the copy's modules.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path

PACKAGE = "fp8kernels"


def _package_modules() -> dict:
    """The fp8kernels modules sys.modules holds now, by name."""
    return {name: module for name, module in sys.modules.items()
            if name == PACKAGE or name.startswith(PACKAGE + ".")}


class KernelTree:
    """fp8kernels as another folder holds it (a checkout's `kernels/`, or a copy of one)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if not (self.path / "__init__.py").is_file():
            raise ValueError(f"{self.path}: not a copy of fp8kernels (no __init__.py there)")
        self._modules: dict = {}
        with self.active():
            spec = importlib.util.spec_from_file_location(PACKAGE, self.path / "__init__.py",
                                                          submodule_search_locations=[str(self.path)])
            package = importlib.util.module_from_spec(spec)
            sys.modules[PACKAGE] = package
            spec.loader.exec_module(package)
            self.gemm = importlib.import_module(f"{PACKAGE}.gemm")
            self.gemm_configs = importlib.import_module(f"{PACKAGE}.gemm_configs")

    @contextlib.contextmanager
    def active(self):
        """The copy's modules in sys.modules in place of the installed ones, these put back after (with the
        modules the copy imported meanwhile kept as its own)."""
        installed = _package_modules()
        for name in installed:
            del sys.modules[name]
        sys.modules.update(self._modules)
        try:
            yield
        finally:
            self._modules = _package_modules()
            for name in self._modules:
                del sys.modules[name]
            sys.modules.update(installed)

    def config(self, config):
        """The installed package's Fp8GemmConfig as the copy's own; a ValueError where the copy's has no such field."""
        fields = dataclasses.asdict(config)
        known = {field.name for field in dataclasses.fields(self.gemm_configs.Fp8GemmConfig)}
        missing = sorted(set(fields) - known)
        if missing:
            raise ValueError(f"{self.path}: its Fp8GemmConfig has no field {', '.join(missing)}")
        return self.gemm_configs.Fp8GemmConfig(**fields)

    def fp8_gemm(self, a, b_t, scale_a, scale_b, *, granularity, fast_accum: bool = False, config=None):
        """The copy's fp8_gemm, on a config of the copy's own (`config`: converted once, outside a timed loop);
        the granularity goes by its value, since the copy's enums are its own classes."""
        with self.active():
            return self.gemm.fp8_gemm(a, b_t, scale_a, scale_b, granularity=getattr(granularity, "value", granularity),
                                      fast_accum=fast_accum, config=config)
