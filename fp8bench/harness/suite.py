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

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_COMMANDS = ("matmul", "cast", "roofline", "e2e", "numerics loss", "numerics stats", "numerics startup", "numerics optimizer")
RESUMABLE_COMMANDS = ("matmul", "cast", "roofline", "e2e")  # those with --resume


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
    from fp8bench.harness.env import cuda_device_name
    from fp8bench.model.hardware import gpu_key

    name = cuda_device_name()
    return "no-gpu" if name is None else gpu_key(name)


def load_suite(path: Path) -> Suite:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not valid TOML ({err})") from None
    benches = data.get("bench")
    if not benches:
        raise ValueError(f"{path}: no [[bench]] entries")
    entries = []
    for index, bench in enumerate(benches):
        bench = dict(bench)
        command = bench.pop("command", None)
        if command not in _COMMANDS:
            raise ValueError(f"{path}: [[bench]] #{index + 1} needs command = one of {', '.join(_COMMANDS)}")
        if "out" in bench:
            raise ValueError(f"{path}: [[bench]] #{index + 1} sets `out`; runs go to the suite's out/<name>")
        name = str(bench.pop("name", f"{index + 1:02d}-{command}"))
        entries.append(SuiteEntry(name, command, bench))
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: [[bench]] names must be unique, got {names}")
    return Suite(str(data.get("name", path.stem)), Path(data.get("out", f"runs/{path.stem}")), tuple(entries), data)
