"""Real text that is on every machine without a download: the source files of Python's standard library,
tokenised byte-level (vocabulary 256), for the numerics benchmark's loss curves.

The files are listed in a fixed order (sorted relative paths under `sysconfig.get_paths()["stdlib"]`,
installed packages left out), split into training and validation by file (every `VALIDATION_EVERY`-th
file is held out, so no file is in both), and concatenated. `TextCorpus.metadata()` records the Python
version, the number of files and bytes, and hashes of the file list and of the bytes: two machines
trained on the same text exactly when the hashes agree (another Python version has other sources).

Batches are windows of the token stream at offsets drawn from a seeded generator: the same seed gives
the same batches on every machine.
"""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

VOCAB_SIZE = 256  # byte-level tokens
VALIDATION_EVERY = 20  # every 20th file (in the fixed order) is validation text: 5%
_INSTALLED = {"site-packages", "dist-packages"}  # third-party packages differ between machines


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's .py files, sorted by relative path, without installed packages."""
    root = root or stdlib_root()
    files = (p for p in root.rglob("*.py") if not _INSTALLED & set(p.relative_to(root).parts) and p.is_file())
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


@dataclass(frozen=True)
class TextCorpus:
    """Byte tokens (uint8) of the training and validation files, and what they were read from."""

    train: torch.Tensor
    validation: torch.Tensor
    train_files: tuple[str, ...]
    validation_files: tuple[str, ...]
    files_sha256: str  # of the relative paths, in order, train and validation marked
    bytes_sha256: str  # of the bytes, in the same order

    def __post_init__(self) -> None:
        for name in ("train", "validation"):
            tokens = getattr(self, name)
            if tokens.dtype != torch.uint8 or tokens.dim() != 1:
                raise ValueError(f"{name} tokens must be a 1-D uint8 tensor, got {tokens.dtype} {tuple(tokens.shape)}")

    def metadata(self) -> dict:
        """What a run records so that two machines can tell whether they trained on the same text."""
        return {
            "source": "python-stdlib",
            "python": platform.python_version(),
            "tokenizer": f"bytes (vocab {VOCAB_SIZE})",
            "train_files": len(self.train_files),
            "validation_files": len(self.validation_files),
            "train_bytes": self.train.numel(),
            "validation_bytes": self.validation.numel(),
            "files_sha256": self.files_sha256,
            "bytes_sha256": self.bytes_sha256,
        }


def load_stdlib_corpus(max_bytes: int | None = None, root: Path | None = None) -> TextCorpus:
    """The standard library's sources as a TextCorpus; `max_bytes` keeps the files, in order, while their
    sizes sum to at most that (a smaller corpus for quick runs and tests; the hashes tell them apart)."""
    root = root or stdlib_root()
    files = stdlib_files(root)
    if not files:
        raise ValueError(f"no .py files under {root}: this Python has no standard library sources")
    names = {"train": [], "validation": []}
    chunks = {"train": [], "validation": []}
    list_hash, bytes_hash = hashlib.sha256(), hashlib.sha256()
    total = 0
    for index, path in enumerate(files):
        data = path.read_bytes()
        if max_bytes is not None and total + len(data) > max_bytes:
            break
        total += len(data)
        split = "validation" if index % VALIDATION_EVERY == VALIDATION_EVERY - 1 else "train"
        relative = path.relative_to(root).as_posix()
        names[split].append(relative)
        chunks[split].append(data)
        list_hash.update(f"{split}:{relative}\n".encode())
        bytes_hash.update(data)
    if not chunks["train"] or not chunks["validation"]:
        raise ValueError(f"max_bytes={max_bytes} leaves no {'train' if not chunks['train'] else 'validation'} text; give more")
    tokens = {split: torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8) for split, parts in chunks.items()}
    return TextCorpus(
        tokens["train"], tokens["validation"], tuple(names["train"]), tuple(names["validation"]),
        list_hash.hexdigest(), bytes_hash.hexdigest(),
    )  # fmt: skip


def batches(tokens: torch.Tensor, batch_size: int, seq_len: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (tokens[B, S], targets[B, S]) int64 batches: windows of `tokens` at seeded random offsets,
    targets shifted by one token."""
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be positive, got {batch_size} and {seq_len}")
    if tokens.numel() < seq_len + 1:
        raise ValueError(f"{tokens.numel()} tokens cannot fill a window of {seq_len} + 1")
    generator = torch.Generator().manual_seed(seed)
    window = torch.arange(seq_len + 1)
    while True:
        starts = torch.randint(0, tokens.numel() - seq_len, (batch_size,), generator=generator)
        rows = tokens[starts[:, None] + window].long()
        yield rows[:, :-1], rows[:, 1:]


def fixed_batches(tokens: torch.Tensor, batch_size: int, seq_len: int, count: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` batches of `batches`, kept: the same validation set at every evaluation."""
    stream = batches(tokens, batch_size, seq_len, seed)
    return [next(stream) for _ in range(count)]
