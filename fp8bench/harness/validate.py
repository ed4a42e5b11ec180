"""Checks for the files fp8bench reads back (results CSV, metadata.json, suite files, baselines).

Every reader raises one exception, `MalformedFile`, for input it cannot trust; the command line turns it
into one line naming the file (and the row) and exit code 2. A malformed file is an error, never data:
a torn row, a repeat count that disagrees with its repeats, or a time that is not a finite positive
number would otherwise be compared, gated and published as if it had been measured.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The times a cell may hold, ms: from a nanosecond to about three hours. A GPU kernel, layer or training
# step lies far inside; a number outside is a corrupted cell, and ratios of such would overflow downstream.
MIN_TIME_MS = 1e-6
MAX_TIME_MS = 1e7


class MalformedFile(ValueError):
    """A file fp8bench reads is not what it claims to be: exit code 2, one line naming the file."""

    def __init__(self, path: Path | str, detail: str):
        self.path = Path(path)
        self.detail = detail
        super().__init__(f"{path}: {detail}")


class UsageError(Exception):
    """Bad options, or an input path that is not what the command needs: exit code 2, one line."""


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """Around code that reads what the user named: an OSError or ValueError there is the user's to fix,
    a UsageError (one line, exit 2), not a traceback; a MalformedFile stays what it is."""
    try:
        yield
    except MalformedFile:
        raise
    except (OSError, ValueError) as err:
        raise UsageError(str(err)) from None


def read_text(path: Path) -> str:
    """The file's text as UTF-8; MalformedFile for bytes that are not."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise MalformedFile(path, f"not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})") from None


def finite_number(text: str) -> float:
    """A decimal number as written by fp8bench; ValueError for anything else (nan, inf, words)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def time_ms(text: str) -> float:
    """A measured time in ms: finite, in [MIN_TIME_MS, MAX_TIME_MS]."""
    value = finite_number(text)
    if not MIN_TIME_MS <= value <= MAX_TIME_MS:
        raise ValueError(f"{text!r} is not a time in [{MIN_TIME_MS:g}, {MAX_TIME_MS:g}] ms")
    return value


def shown(value: Any, limit: int = 40) -> str:
    """A value from a file, quoted and cut short, for an error message of one line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def json_type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


# C0 and C1 control characters and DEL: a terminal acts on them (escape sequences, carriage returns).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Text from a file made safe for one line of a terminal: control characters (escape sequences,
    newlines) shown as \\xNN instead of acted on."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
