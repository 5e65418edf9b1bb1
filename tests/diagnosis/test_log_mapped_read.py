"""A log file is read through its mapping (one copy of each byte, issue 20), and that gives
exactly the blocks, and so the facts, that reading it chunk by chunk gives: long lines across
chunk boundaries, lines past the cap, no final newline, a size that is a multiple of the chunk,
an empty file, a binary one."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.diagnosis.logfacts import CHUNK_BYTES, MAX_LINE_BYTES, _iter_chunks, _Reader, _whole_lines, extract
from bot.diagnosis.models import LogText

NOISE = b"(APIServer pid=1) INFO 06-01 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s\n"
NO_KV = b"ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`.\n"
WEIGHTS = b"INFO 06-01 10:00:00 [gpu_model_runner.py:1801] Model loading took 14.99 GiB and 9.1 seconds"
FRAME = b"Loading safetensors checkpoint shards:  42% Completed | 42/100 [00:42<00:58, 1.0it/s]\r"


def _noise(size: int) -> bytes:
    return NOISE * (size // len(NOISE))


def _cases() -> dict[str, bytes]:
    exact = _noise(CHUNK_BYTES)
    exact = exact + b"x" * (CHUNK_BYTES - len(exact) - 1) + b"\n"  # one chunk to the byte, newline last
    return {
        "short lines, no final newline": _noise(5 * 2**20) + NO_KV.rstrip(b"\n"),
        "a multiple of the chunk": exact * 2,
        "a line under the cap across a chunk boundary": _noise(2**20) + FRAME * (int(1.5 * 2**20) // len(FRAME))
        + WEIGHTS + b"\n" + NO_KV,
        "a line past the cap, then short lines": _noise(3 * 2**20) + WEIGHTS + b"\r"
        + FRAME * ((MAX_LINE_BYTES + 3 * 2**20) // len(FRAME)) + b"\n" + _noise(3 * 2**20) + NO_KV,
        "one huge line": WEIGHTS + b"\r" + FRAME * (7 * 2**20 // len(FRAME)) + NO_KV.rstrip(b"\n"),
        "a first line longer than the cap in a later chunk": _noise(CHUNK_BYTES - 100) + b"y" * (MAX_LINE_BYTES + 50)
        + b"\n" + NO_KV,
    }


def _chunked_blocks(path: Path) -> list[bytes]:
    return list(_whole_lines(_iter_chunks(LogText(path=path))))


@pytest.mark.parametrize("case", sorted(_cases()))
def test_the_mapped_read_gives_the_blocks_and_facts_of_the_chunked_read(tmp_path: Path, case: str) -> None:
    path = tmp_path / "previous.log"
    path.write_bytes(_cases()[case])
    reader = _Reader([])

    mapped = list(reader.blocks(LogText(path=path)))

    assert mapped == _chunked_blocks(path)
    assert reader.total_bytes == path.stat().st_size
    from_text = extract(LogText(text=path.read_bytes().decode("utf-8")))  # the chunked path, from memory
    assert extract(LogText(path=path)) == from_text


def test_an_empty_log_and_a_binary_one_read_as_before(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    binary = tmp_path / "core.bin"
    binary.write_bytes(b"\x7fELF\x00\x01" * (CHUNK_BYTES // 2))

    assert list(_Reader([]).blocks(LogText(path=empty))) == []
    reader = _Reader([])
    assert list(reader.blocks(LogText(path=binary))) == []
    assert reader.binary and reader.total_bytes == CHUNK_BYTES  # the first chunk, as counted chunk by chunk
    facts = extract(LogText(path=binary))
    assert facts.binary and facts.byte_count == CHUNK_BYTES and facts.line_count == 0
