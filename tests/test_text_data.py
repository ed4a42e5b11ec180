"""The byte-level standard-library corpus: fixed order, split by file, seeded batches, hashes that tell corpora apart."""

from __future__ import annotations

import pytest
import torch

from fp8bench.nn import text_data


@pytest.fixture(scope="module")
def corpus():
    return text_data.load_stdlib_corpus(max_bytes=2_000_000)


def test_files_sorted_without_installed_packages():
    root = text_data.stdlib_root()
    files = text_data.stdlib_files(root)
    relative = [p.relative_to(root).as_posix() for p in files]
    assert relative == sorted(relative)
    assert not any("site-packages" in r or "dist-packages" in r for r in relative)
    assert "os.py" in relative


def test_split_by_file_and_bytes_add_up(corpus):
    assert not set(corpus.train_files) & set(corpus.validation_files)
    assert len(corpus.validation_files) == (len(corpus.train_files) + len(corpus.validation_files)) // text_data.VALIDATION_EVERY
    root = text_data.stdlib_root()
    first = (root / corpus.train_files[0]).read_bytes()
    assert bytes(corpus.train[: len(first)].tolist()) == first
    sizes = sum((root / f).stat().st_size for f in (*corpus.train_files, *corpus.validation_files))
    assert corpus.train.numel() + corpus.validation.numel() == sizes <= 2_000_000


def test_same_text_same_hashes_other_text_other_hashes(corpus):
    again = text_data.load_stdlib_corpus(max_bytes=2_000_000)
    smaller = text_data.load_stdlib_corpus(max_bytes=1_000_000)
    assert again.metadata() == corpus.metadata()
    assert torch.equal(again.train, corpus.train)
    assert smaller.files_sha256 != corpus.files_sha256 and smaller.bytes_sha256 != corpus.bytes_sha256
    meta = corpus.metadata()
    assert meta["train_bytes"] == corpus.train.numel() and meta["source"] == "python-stdlib"


def test_batches_are_seeded_windows_with_shifted_targets(corpus):
    first = next(text_data.batches(corpus.train, 4, 32, seed=1))
    same = next(text_data.batches(corpus.train, 4, 32, seed=1))
    other = next(text_data.batches(corpus.train, 4, 32, seed=2))
    tokens, targets = first
    assert tokens.shape == targets.shape == (4, 32) and tokens.dtype == torch.int64
    assert torch.equal(tokens[:, 1:], targets[:, :-1])
    assert int(tokens.max()) < text_data.VOCAB_SIZE
    assert torch.equal(first[0], same[0]) and not torch.equal(first[0], other[0])
    fixed = text_data.fixed_batches(corpus.validation, 2, 16, count=3, seed=0)
    assert len(fixed) == 3 and torch.equal(fixed[0][0], text_data.fixed_batches(corpus.validation, 2, 16, 3, 0)[0][0])


def test_bad_arguments_say_what_is_wrong(corpus):
    with pytest.raises(ValueError, match="leaves no train text"):
        text_data.load_stdlib_corpus(max_bytes=1)
    with pytest.raises(ValueError, match="cannot fill a window"):
        next(text_data.batches(corpus.train[:10], 1, 32, seed=0))
    with pytest.raises(ValueError, match="must be positive"):
        next(text_data.batches(corpus.train, 0, 32, seed=0))
