"""fp8bench.report.console.frame_table: the tools' probes print their DataFrames through it."""

from __future__ import annotations

import pandas as pd
from rich.console import Console

from fp8bench.report.console import frame_table


def rendered(table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_floats_to_four_digits_missing_values_blank_and_columns_chosen():
    frame = pd.DataFrame({"variant": ["ours", "theirs"], "kernel_ms": [0.41229613, float("nan")], "launches": [2, 3]})
    text = rendered(frame_table(frame, "probe", ["variant", "kernel_ms"]))
    assert "probe" in text and "0.4123" in text and "0.41229" not in text
    assert "nan" not in text.lower() and "launches" not in text
    assert "launches" in rendered(frame_table(frame, "all columns"))
