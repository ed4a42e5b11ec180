"""Baselines: runs kept to compare later ones against, keyed by the GPU model they were measured on.

    baselines/<gpu-model>/<name>/<entry>/results.csv    a saved suite (one run folder per entry)
    baselines/<gpu-model>/<name>/results.csv            a saved single run

Only results.csv and metadata.json are kept: the reports can be rebuilt from them. Timings from two
GPU models differ by design, not by regression, so loading a baseline for another model is refused.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fp8bench.gate.compare import check_unique
from fp8bench.model.hardware import gpu_key
from fp8bench.harness.results import METADATA_JSON, RESULTS_CSV, load_results, read_metadata

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Recorded in metadata.json and able to move timings on one GPU model: told, not refused.
_SOFT_DIFFERENCES = ("power_limit_w", "driver", "cuda_runtime", "sm_clock_max_mhz")


class IncompatibleBaseline(Exception):
    """The baseline was measured on another GPU model (or says not which): exit code 4."""


def run_folders(path: Path) -> dict[str, Path]:
    """The runs at `path`: {"": it} for one run (a folder with results.csv, or the CSV itself), or
    {entry: folder} for a folder of suite runs. Folders whose names start with `_` (re-runs) are not
    entries."""
    path = Path(path)
    if path.is_file():
        return {"": path}
    if (path / RESULTS_CSV).is_file():
        return {"": path}
    if path.is_dir():
        entries = {
            sub.name: sub
            for sub in sorted(path.iterdir())
            if sub.is_dir() and not sub.name.startswith("_") and (sub / RESULTS_CSV).is_file()
        }
        if entries:
            return entries
    raise FileNotFoundError(f"{path}: neither a results CSV, nor a run folder, nor a folder of run folders")


def run_metadata_of(run: Path) -> dict[str, Any]:
    """metadata.json of a run folder, or the one beside a results CSV."""
    run = Path(run)
    return read_metadata(run.parent if run.is_file() else run)


def gpu_model(metadata: Mapping[str, Any]) -> str | None:
    """The hardware-table key of the GPU model a run was measured on, from its full device name and
    memory size (a slug of both where the table lacks it), or None where metadata.json records no GPU."""
    name = metadata.get("gpu_name")
    if not name:
        return None
    return gpu_key(str(name), metadata.get("gpu_memory_gib"))


def check_same_gpu(base: Mapping[str, Any], new: Mapping[str, Any], where: str) -> list[str]:
    """Refuse (IncompatibleBaseline) two runs from different GPU models; return notes on what else
    differs and can move timings (power limit, driver, ...)."""
    base_model, new_model = gpu_model(base), gpu_model(new)
    for side, model in (("baseline", base_model), ("new run", new_model)):
        if model is None:
            raise IncompatibleBaseline(
                f"{where}: the {side} records no GPU (no gpu_name in its {METADATA_JSON}), so it cannot be "
                "told whether both were measured on the same GPU model"
            )
    if base_model != new_model:
        raise IncompatibleBaseline(
            f"{where}: the baseline was measured on {base_model} ({base.get('gpu_name')}) and the new run on "
            f"{new_model} ({new.get('gpu_name')}); timings from different GPU models are not comparable. "
            f"Save a baseline on {new_model}: fp8bench baseline save RUN --name NAME"
        )
    return [
        f"{where}: {key} differs (baseline {base.get(key)}, new {new.get(key)})"
        for key in _SOFT_DIFFERENCES
        if key in base and key in new and base[key] != new[key]
    ]


# Libraries whose version can move a kernel's time; a change is told (or refused, per the suite).
_TIMING_LIBRARIES = ("torch", "triton", "transformer_engine", "torchao")


def environment_differences(
    base: Mapping[str, Any], new: Mapping[str, Any], base_timers: set[str], new_timers: set[str]
) -> list[str]:
    """How the two runs were timed differently: the timer of their measured rows (a CUPTI kernel time
    and a CUDA-event time of the same kernel differ by the launch gap), the harness's timing and clock
    policy (metadata `timing`, `clocks`), and the versions of the libraries that run the kernels."""
    differences = []
    if base_timers != new_timers:
        differences.append(f"timer {'/'.join(sorted(base_timers)) or 'none'} -> {'/'.join(sorted(new_timers)) or 'none'}")
    for key in ("timing", "clocks"):
        old, now = base.get(key), new.get(key)
        if old is None or now is None or old == now:
            continue
        if isinstance(old, Mapping) and isinstance(now, Mapping):
            changed = [f"{k} {old.get(k)} -> {now.get(k)}" for k in sorted(set(old) | set(now)) if old.get(k) != now.get(k)]
            differences.append(f"{key} policy: {', '.join(changed)}")
        else:
            differences.append(f"{key} policy {old} -> {now}")
    old_versions, new_versions = base.get("versions") or {}, new.get("versions") or {}
    for library in _TIMING_LIBRARIES:
        if library in old_versions and library in new_versions and old_versions[library] != new_versions[library]:
            differences.append(f"{library} {old_versions[library]} -> {new_versions[library]}")
    return differences


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise ValueError(f"baseline name {name!r}: use letters, digits, '.', '_' and '-' (e.g. main)")


def tree_gpu_model(path: Path) -> str:
    """The one GPU model every run at `path` was measured on; ValueError if none or several."""
    models = {entry or str(path): gpu_model(run_metadata_of(run)) for entry, run in run_folders(path).items()}
    if None in models.values():
        missing = [entry for entry, model in models.items() if model is None]
        raise ValueError(f"{path}: no gpu_name in the metadata of {', '.join(missing)}; a baseline is keyed by GPU model")
    if len(set(models.values())) != 1:
        raise ValueError(f"{path}: runs from several GPU models ({', '.join(sorted(set(models.values())))})")
    return next(iter(models.values()))


def save(run: Path, name: str, root: Path, force: bool = False) -> Path:
    """Copy a run (or a folder of suite runs) to root/<gpu-model>/<name>/ and return that folder."""
    _check_name(name)
    runs = run_folders(run)
    for source in runs.values():
        check_unique(load_results(source))  # a malformed run is refused (MalformedFile), never kept as a baseline
    destination = Path(root) / tree_gpu_model(run) / name
    if destination.exists():
        if not force:
            raise ValueError(f"baseline {destination} exists; pass --force to replace it")
        shutil.rmtree(destination)
    for entry, source in runs.items():
        target = destination / entry
        target.mkdir(parents=True, exist_ok=True)
        csv_path = source if source.is_file() else source / RESULTS_CSV
        shutil.copyfile(csv_path, target / RESULTS_CSV)
        metadata = csv_path.parent / METADATA_JSON
        if metadata.is_file():
            shutil.copyfile(metadata, target / METADATA_JSON)
    return destination


def resolve(baseline: str, root: Path, model: str) -> Path:
    """A baseline given as a path (used as it is) or as a name, looked up under root/<model>/.

    A name saved only for other GPU models raises IncompatibleBaseline; an unknown one ValueError.
    """
    as_path = Path(baseline)
    if as_path.exists():
        return as_path
    _check_name(baseline)
    root = Path(root)
    if (root / model / baseline).is_dir():
        return root / model / baseline
    others = sorted(d.name for d in root.iterdir() if (d / baseline).is_dir()) if root.is_dir() else []
    if others:
        raise IncompatibleBaseline(
            f"baseline {baseline!r} exists for {', '.join(others)} but not for {model}, the GPU model here; "
            f"save one on this GPU: fp8bench baseline save RUN --name {baseline}"
        )
    raise ValueError(f"no baseline {baseline!r} under {root}/{model}/ (save one: fp8bench baseline save RUN --name {baseline})")
