"""Run metadata: the machine, GPU and software a result was measured on, saved beside every CSV."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
# Libraries whose versions decide the numbers; a missing one is recorded as None.
_LIBRARIES = ("torch", "triton", "transformer_engine", "torchao", "pandas", "plotly", "fp8bench")


def _version(module: str) -> str | None:
    for dist in (module, module.replace("_", "-")):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        return getattr(__import__(module), "__version__", None)
    except Exception:  # noqa: BLE001 - a broken optional library is recorded as absent
        return None


def git_revision() -> str:
    """FP8BENCH_GIT_REV where set -- a tree copied to a GPU host may carry a stale .git, or none --,
    else the checkout's commit (+ "-dirty")."""
    if os.environ.get("FP8BENCH_GIT_REV"):
        return os.environ["FP8BENCH_GIT_REV"]
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cuda_device_name() -> str | None:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def gpu_metadata() -> dict[str, Any]:
    """Device properties and NVML readings; empty where there is no CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        return {}
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    info: dict[str, Any] = {
        "gpu_name": props.name,
        "gpu_sms": props.multi_processor_count,
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "gpu_l2_mib": round(props.L2_cache_size / 2**20, 1),
        "compute_capability": f"{props.major}.{props.minor}",
        "cuda_runtime": torch.version.cuda,
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        info.update(
            driver=pynvml.nvmlSystemGetDriverVersion(),
            sm_clock_max_mhz=pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            mem_clock_max_mhz=pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            power_limit_w=pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000,
            temperature_c_at_start=pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        )
    except Exception as err:  # noqa: BLE001 - NVML is optional; say why it is missing
        info["nvml_error"] = str(err)
    return info


def script_command_line(without_arguments: str = "") -> str:
    """The command line of a script run from the repository (tools/*.py), as typed there: `python tools/NAME.py
    ARGS`, whatever the working directory's path to it was; `without_arguments` stands for ARGS where there are
    none (a command function called from Python)."""
    arguments = sys.argv[1:] or shlex.split(without_arguments)
    return shlex.join(["python", f"tools/{Path(sys.argv[0]).name}", *arguments])


def run_metadata(command: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a run records about itself: the command, time, revision, host, versions, the GPU, and a GEMM
    config forced on our kernels (FP8KERNELS_GEMM_CONFIG) where one is: such a run is an experiment."""
    from fp8kernels.gemm_configs import CONFIG_OVERRIDE_ENV

    override = os.environ.get(CONFIG_OVERRIDE_ENV)
    return {
        "command": command,
        "started_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_revision": git_revision(),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "versions": {lib: _version(lib) for lib in _LIBRARIES},
        **gpu_metadata(),
        **({"gemm_config_override": override} if override else {}),
        **(extra or {}),
    }
