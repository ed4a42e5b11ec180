"""Suite files: TOML lists of benchmark invocations (and, for gating, their thresholds).

    name = "square"
    out = "reports/{gpu}"             # where the runs go, one folder per entry; {gpu}: the GPU's table key

    [[bench]]
    name = "square-all"               # the run folder's name
    command = "matmul"
    shape-gen = "square"
    granularity = "all"
    fast-accum = "both"

Every key of a [[bench]] table but `name` and `command` is that command's long option; lists repeat
the option (backend = ["cublas", "triton"]) and booleans toggle it (report = false -> --no-report).
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8bench.harness.validate import MalformedFile, read_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_COMMANDS = ("matmul", "cast", "roofline", "e2e", "numerics loss", "numerics stats", "numerics startup", "numerics optimizer")
_COMMANDS = ("matmul", "cast", "roofline", "e2e", "numerics loss", "numerics stats", "numerics startup", "numerics optimizer")
RESUMABLE_COMMANDS = ("matmul", "cast", "roofline", "e2e", "numerics loss")  # those with --resume
# An entry names its run folder: one path segment, no way out of the suite's folder.
_ENTRY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class SuiteEntry:
    name: str
    command: str
    options: dict[str, Any]

    def argv(self, base: Path, resume: bool = False) -> list[str]:
        """The command line; `resume` continues the entry's run folder where it holds results already."""
        args = self.command.split()  # a sub-app's command is two words: "numerics loss"
        for key, value in self.options.items():
            if isinstance(value, bool):
                args.append(f"--{key}" if value else f"--no-{key}")
            else:
                for item in value if isinstance(value, list) else [value]:
                    args += [f"--{key}", str(item)]
        run_dir = base / self.name
        if resume and self.command in RESUMABLE_COMMANDS and (run_dir / "results.csv").exists():
            args.append("--resume")
        return [*args, "--out", str(run_dir)]


@dataclass(frozen=True)
class Suite:
    name: str
    out: Path
    entries: tuple[SuiteEntry, ...]
    raw: dict[str, Any] = field(default_factory=dict)  # other tables (e.g. [gate]) for their owners


def detected_gpu_key() -> str:
    """The visible GPU's key (fp8bench.model.hardware.gpu_key), for `{gpu}` in a suite's `out`."""
    from fp8bench.harness.env import gpu_metadata
    from fp8bench.model.hardware import gpu_key

    device = gpu_metadata()
    return gpu_key(device["gpu_name"], device["gpu_memory_gib"]) if device else "no-gpu"


_OPTION_VALUE = (str, int, float, bool)


def _option_problem(key: str, value: Any) -> str | None:
    """Why a [[bench]] key cannot be a command-line option, or None."""
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list) and (not value or any(isinstance(item, bool) for item in value)):
        return f"`{key}` must be a value or a non-empty list of strings or numbers"
    if not all(isinstance(item, _OPTION_VALUE) for item in items):
        return f"`{key}` must be a string, number, boolean or a list of those, not {type(items[0]).__name__}"
    if any(isinstance(item, float) and not math.isfinite(item) for item in items):
        return f"`{key}` must be a finite number"
    return None


def load_suite(path: Path) -> Suite:
    """A suite file, checked: MalformedFile (naming the file and the entry) for anything but the
    layout in this module's docstring."""
    path = Path(path)
    try:
        data = tomllib.loads(read_text(path))
    except tomllib.TOMLDecodeError as err:
        raise MalformedFile(path, f"not valid TOML ({err})") from None
    unknown = sorted(set(data) - {"name", "out", "bench", "gate"})
    if unknown:
        raise MalformedFile(path, f"unknown key or table {unknown[0]!r} (a suite holds name, out, [[bench]] and [gate])")
    for key in ("name", "out"):
        if key in data and not (isinstance(data[key], str) and data[key]):
            raise MalformedFile(path, f"`{key}` must be a non-empty string")
    if "gate" in data and not isinstance(data["gate"], dict):
        raise MalformedFile(path, "`gate` must be a table ([gate])")
    benches = data.get("bench")
    if not benches:
        raise MalformedFile(path, "no [[bench]] entries")
    if not isinstance(benches, list) or not all(isinstance(bench, dict) for bench in benches):
        raise MalformedFile(path, "`bench` must be an array of tables ([[bench]])")
    entries = []
    for index, bench in enumerate(benches):
        where = f"[[bench]] #{index + 1}"
        bench = dict(bench)
        command = bench.pop("command", None)
        if command not in _COMMANDS:
            raise MalformedFile(path, f"{where} needs command = one of {', '.join(_COMMANDS)}")
        if "out" in bench:
            raise MalformedFile(path, f"{where} sets `out`; runs go to the suite's out/<name>")
        name = bench.pop("name", f"{index + 1:02d}-{command}")
        if not isinstance(name, str) or not _ENTRY_NAME.match(name):
            raise MalformedFile(path, f"{where}: name must be letters, digits, '.', '_' and '-' (got {name!r})")
        problem = next((p for p in (_option_problem(k, v) for k, v in bench.items()) if p), None)
        if problem:
            raise MalformedFile(path, f"{where} ({name}): {problem}")
        entries.append(SuiteEntry(name, command, bench))
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise MalformedFile(path, f"[[bench]] names must be unique, got {names}")
    return Suite(data.get("name", path.stem), Path(data.get("out", f"runs/{path.stem}")), tuple(entries), data)
