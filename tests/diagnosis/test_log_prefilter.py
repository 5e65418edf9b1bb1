"""The log reader's literal prefilter (issue 20): only lines holding a literal some log format
declares are decoded and matched, so the prefilter must never drop a line a format's regex
matches. Checked three ways: against every format's regex (strings generated from the regex
itself), against every real line of the fixture bundles and the shared corpus that a format
matches, and the scanner against a naive line-by-line search. Also: the one-match test for a
request payload line says exactly what `message_span` says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from builders import SHARED_CORPUS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.diagnosis.logfacts import (
    MAX_LINE_CHARS,
    PACKED_PATTERNS,
    KeywordScanner,
    _clean,
    extract,
    trusted_parts,
    trusted_text,
)
from bot.diagnosis.logformats import FORMATS, KEYWORDS, PAYLOAD, PAYLOAD_LINE, message_span
from bot.diagnosis.models import LogText
from bot.diagnosis.playbooks import default_playbooks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _real_lines() -> list[str]:
    """Every \\r-separated part of every line of the fixture logs and (when present) the corpus."""
    logs = sorted(FIXTURES.glob("*/*/previous.log")) + sorted(SHARED_CORPUS.glob("*/previous.log"))
    return [part for log in logs for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
            for part in line.split("\r") if part.strip()]


REAL_LINES = _real_lines()


def _naive_line_starts(chunk: bytes, keywords: list[bytes]) -> list[int]:
    starts, pos = [], 0
    for line in chunk.split(b"\n"):
        if any(kw in line for kw in keywords):
            starts.append(pos)
        pos += len(line) + 1
    return starts


def test_the_scanned_keywords_are_the_formats_literals_and_none_spans_a_line():
    assert set(KEYWORDS) == {lit for fmt in FORMATS for lit in fmt.literals}
    assert all("\n" not in lit and "\r" not in lit for lit in KEYWORDS)


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_every_string_a_format_matches_holds_one_of_its_literals(fmt):
    """The gate per format: a regex that can match without any of the format's literals would
    miss lines the prefilter never lets through (v1_maxlen was case-insensitive against a
    case-sensitive literal; ray_pg had an alternative without its literal)."""

    @SETTINGS
    @given(st.from_regex(fmt.regex, fullmatch=False))
    def check(text: str) -> None:
        if fmt.regex.search(text):
            assert any(lit in text for lit in fmt.literals), (fmt.name, text)

    check()


def test_every_real_line_a_format_matches_passes_the_prefilter():
    literals = list(dict.fromkeys(list(KEYWORDS) + [lit for b in default_playbooks() for lit in b.literals()]))
    scanner = KeywordScanner([lit.encode() for lit in literals])
    matched = 0
    for line in REAL_LINES:
        start, end = message_span(line)
        message = line[start:end]
        for fmt in FORMATS:
            if fmt.regex.search(message):
                matched += 1
                assert any(lit in message for lit in fmt.literals), (fmt.name, line)
                assert scanner.line_starts(line.encode() + b"\n") == [0], (fmt.name, line)
    assert matched > 300  # the fixtures alone hold hundreds of such lines: the check ran


def test_each_example_line_is_read_through_the_prefilter():
    """Each real line a format matches, as a log of its own, is kept as a line playbooks search."""
    examples = [line for line in REAL_LINES
                if any(fmt.regex.search(line[slice(*message_span(line))]) for fmt in FORMATS)]
    assert len(examples) > 300
    assert [line for line in examples if not extract(LogText(text=line + "\n")).hit_lines] == []


WORDS = [kw.encode() for kw in KEYWORDS] + [b"x", b" ", b"ab", b"\n", b"\r", b"\xe2\x96\x80"]


@SETTINGS
@given(st.lists(st.sampled_from(WORDS), max_size=60), st.integers(1, len(KEYWORDS)))
def test_the_scanner_finds_exactly_the_lines_a_naive_search_finds(parts, n_keywords):
    keywords = [kw.encode() for kw in KEYWORDS[:n_keywords]]  # above PACKED_PATTERNS: several automata
    chunk = b"".join(parts)
    scanner = KeywordScanner(keywords)
    assert scanner.line_starts(chunk) == _naive_line_starts(chunk, keywords)


def test_more_keywords_than_one_packed_searcher_takes_are_all_found():
    keywords = [f"kw{i:03d}word".encode() for i in range(3 * PACKED_PATTERNS + 5)]
    chunk = b"".join(b"noise " + kw + b" more\n" + b"plain line\n" for kw in keywords)
    starts = KeywordScanner(keywords).line_starts(chunk)
    assert len(starts) == len(keywords) == len(_naive_line_starts(chunk, keywords))



@pytest.mark.parametrize("n_keywords", [1, PACKED_PATTERNS, PACKED_PATTERNS + 1, 2 * PACKED_PATTERNS + 5])
def test_the_keywords_are_shared_evenly_between_as_few_searchers_as_the_cap_allows(n_keywords):
    keywords = [f"kw{i:03d}word".encode() for i in range(n_keywords)]
    scanner = KeywordScanner(keywords)
    searchers = -(-n_keywords // PACKED_PATTERNS)
    assert len(scanner.automata) == len(scanner.groups) == searchers  # one pass over the log per searcher
    sizes = [len(group) for group in scanner.groups]
    assert max(sizes) <= PACKED_PATTERNS and max(sizes) - min(sizes) <= 1
    chunk = b"".join(b"noise " + kw + b" more\n" + b"plain line\n" for kw in keywords)
    assert scanner.line_starts(chunk) == _naive_line_starts(chunk, keywords)


def test_a_keyword_holding_another_is_left_out_and_its_lines_are_still_found():
    keywords = [b"MemoryError", b"Error", b"CUDA", b"OOMKilled", b"OOM"]
    chunk = b"x MemoryError: y\nplain\nreason: OOMKilled\nCUDA\n"
    scanner = KeywordScanner(keywords)
    assert scanner.keywords == [b"Error", b"CUDA", b"OOM"]
    assert scanner.line_starts(chunk) == _naive_line_starts(chunk, keywords) == [0, 23, 41]


def test_adjacent_and_overlapping_keywords_on_one_line_count_it_once():
    keywords = [b"Error", b"rror: CUDA", b"CUDA error", b"out of memory"]
    chunk = b"RuntimeError: CUDA error: out of memory\nok\nCUDA errorError\n"
    assert KeywordScanner(keywords).line_starts(chunk) == [0, chunk.index(b"CUDA errorError")]


def _payload_by_span(text: str) -> bool:
    """The definition: nothing but prefixes and white space before the first payload marker."""
    if PAYLOAD.search(text) is None:
        return False
    start, end = message_span(text)
    return not text[start:end].strip()


PIECES = ["INFO 06-01 10:00:00 [logger.py:39] ", "(APIServer pid=1) ", "2026-06-01T10:00:00.1Z ", "vllm-1  | ",
          "INFO:     ", "Received request cmpl-1: ", "prompt: ", "output: ", "Request r1 details: ",
          '"POST /v1/completions HTTP/1.1" ', "Generated response x ", "ValueError: max seq len ", " ", "\t",
          "\u00a0", "prompt_token_ids: ", "words ", "x", "é"]


@SETTINGS
@given(st.lists(st.sampled_from(PIECES), max_size=8))
def test_the_payload_line_match_says_what_message_span_says(pieces):
    text = "".join(pieces)
    assert (PAYLOAD_LINE.match(text) is not None) == _payload_by_span(text), text
    # the reader's shortcut skips a line only when the full path would keep nothing of it
    raw = text.encode()
    full = [trusted_text(part) for part in _clean(raw)]
    assert _is_payload_line(raw) == (PAYLOAD_LINE.match(text) is not None), text
    assert not _is_payload_line(raw) or full == [""], text


def test_the_payload_line_match_on_real_lines():
    lines = REAL_LINES + [re.sub(r"^", "  ", line) for line in REAL_LINES[:200]]
    assert [bool(PAYLOAD_LINE.match(t)) for t in lines] == [_payload_by_span(t) for t in lines]


def _is_payload_line(raw: bytes) -> bool:
    """The reader's former first step: a one-part line (no \r, no escape) PAYLOAD_LINE matches."""
    text = raw.decode("utf-8", errors="replace")
    return "\r" not in text and "\x1b[" not in text and PAYLOAD_LINE.match(text[:MAX_LINE_CHARS]) is not None


@SETTINGS
@given(st.lists(st.sampled_from(PIECES + ["\r", "\x1b[0m", "\r  \r", "\n"]), max_size=8))
def test_trusted_parts_is_the_full_path(pieces):
    """The reader's one-decode path gives what `_clean`, `_is_payload_line` and `trusted_text` gave."""
    raw = "".join(pieces).encode()
    full = [] if _is_payload_line(raw) else [trusted_text(part) for part in _clean(raw)]
    assert trusted_parts(raw) == full, raw


def test_trusted_parts_on_real_lines():
    for line in REAL_LINES + [re.sub(r"^", "  ", line) for line in REAL_LINES[:200]]:
        raw = line.encode()
        full = [] if _is_payload_line(raw) else [trusted_text(part) for part in _clean(raw)]
        assert trusted_parts(raw) == full, line
