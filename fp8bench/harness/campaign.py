"""`fp8bench run --parallel`: a suite's entries side by side, one per GPU of this host.

Each entry runs as its own `fp8bench` process that sees one GPU (CUDA_VISIBLE_DEVICES), its console
output going to `<out>/<entry>.log`; a GPU takes the next entry, in the suite's order, when its last one
ends. Every comparison fp8bench makes is between rows of one run folder, measured on one GPU, so spreading
entries over the GPUs of a host changes none of them; it lets a suite that takes half an hour on one GPU
end in one device call. The exit code is the worst of the entries'.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fp8bench.harness.suite import Suite, SuiteEntry

POLL_S = 1.0


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (or their indexes)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [gpu for gpu in visible.split(",") if gpu.strip()]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


def run_parallel(suite: Suite, base: Path, gpus: list[str], echo: Callable[[str], None], resume: bool = False) -> int:
    """Run every entry of `suite` into `base`, at most one per GPU at a time; the worst exit code.
    `resume`: entries whose run folder holds results continue it (SuiteEntry.argv)."""
    if not gpus:
        raise ValueError("--parallel spreads the entries over GPUs, and none is visible here")
    base.mkdir(parents=True, exist_ok=True)
    queue: list[SuiteEntry] = list(suite.entries)
    running: dict[str, tuple[subprocess.Popen, SuiteEntry]] = {}
    worst = 0
    try:
        while queue or running:
            for gpu in gpus:
                if gpu not in running and queue:
                    entry = queue.pop(0)
                    with (base / f"{entry.name}.log").open("w") as log:
                        command = [sys.executable, "-m", "fp8bench.cli", *entry.argv(base, resume)]
                        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
                        running[gpu] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), entry)
                    echo(f"GPU {gpu}: {entry.name} -> {base / entry.name} (log {base / entry.name}.log)")
            time.sleep(POLL_S)
            for gpu, (process, entry) in list(running.items()):
                if process.poll() is not None:
                    del running[gpu]
                    code = process.returncode if process.returncode >= 0 else 128 - process.returncode  # killed: 128 + signal
                    worst = max(worst, code)
                    echo(f"GPU {gpu}: {entry.name} ended, exit code {code}")
    finally:
        for process, _ in running.values():  # interrupted: the entries' finished rows are in their folders
            process.terminate()
    return worst
