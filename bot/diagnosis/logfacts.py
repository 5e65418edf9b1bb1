"""One streaming pass over a vLLM container log: every number and stage vLLM and PyTorch print.

Logs can be 100 MB of request noise around a short start-up. Running every regex on every
line would take seconds, so the pass works on byte chunks: one Aho-Corasick scan (C speed)
finds the lines that hold a keyword, and only those are decoded and parsed; a line shape
repeated many times is parsed once. What to look for is data: each message vLLM or PyTorch
prints is one `LogFormat` in `bot.diagnosis.logformats` (its literals, regex, the facts it
yields, versions and source); playbooks add their own literals (see `bot.playbooks`), so a new
cause needs no change here.

Log text is input, not truth: with request logging on, a user's prompt is printed in the log,
and it can quote any vLLM message. So each line is read only between where vLLM's or PyTorch's
own message starts (after the logger, process, kubectl and docker prefixes, none of which is
required) and the first request payload marker (`Received request`, `prompt:`, `output:`, an
HTTP request line): see `LINE_PREFIXES` and `PAYLOAD_MARKS` in `bot.diagnosis.logformats`. What
lies after a marker yields no fact, no error, no stage, and is kept in no line playbooks search
or the diagnosis quotes.

A line longer than MAX_LINE_BYTES (a progress bar that never printed a newline, a binary
blob) keeps its first and last LINE_KEEP_BYTES, so one huge line cannot take memory in
proportion to its size; no real vLLM line comes near that length.
"""

# No `from __future__ import annotations`: see bot/diagnosis/models.py (pydantic start-up cost).
import functools
import itertools
import mmap
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bot.diagnosis.logformats import (  # noqa: F401  (re-exported: the formats' vocabulary)
    FORMATS,
    FRAME_STAGES,
    HANDLERS,
    KEYWORDS,
    MODEL_FILE_HINT,
    PATTERNS,
    PAYLOAD,
    PAYLOAD_LINE,
    PAYLOAD_LITERALS,
    STAGES,
    LogFormat,
    first_mark,
    may_hold_mark,
    message_span,
    to_gib,
    to_int,
)
from bot.diagnosis.models import LogText, empty_dict, empty_list

CHUNK_BYTES = 2 * 1024 * 1024
REPEATS_PARSED = 50  # a line shape seen more often than this is noise (request logs, retries)
HEAD_LINES = 120
TAIL_LINES = 300
MAX_STORED_HITS = 2000  # kept from the start, and as many from the end
MAX_LINE_CHARS = 4000  # of each \r-separated part of a line that is parsed
LINE_KEEP_BYTES = 1024 * 1024  # an over-long line keeps this much of its start and of its end
MAX_LINE_BYTES = 2 * LINE_KEEP_BYTES
# The shape table's cap: past it the rare shapes (those not yet noise) are dropped, and the
# noise shapes keep at most half of the table (the most repeated), so memory stays bounded on
# any log and the repeat guard never switches off. A dropped shape only costs being parsed again
# (at most REPEATS_PARSED times until it is noise once more); the pass over the log stays one.
MAX_SHAPES = 32_768


class Fact(BaseModel):
    model_config = ConfigDict(frozen=True)
    value: Any
    line: str
    line_no: int


class LogFacts(BaseModel):
    """Everything one pass found. Values are GiB for memory and plain ints for tokens."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    facts: dict[str, Fact] = Field(default_factory=empty_dict)
    markers: dict[str, int] = Field(default_factory=empty_dict)  # stage marker -> first line number
    frame_stages: list[str] = Field(default_factory=empty_list)  # stages named by traceback frames
    errors: list[Fact] = Field(default_factory=empty_list)  # exception lines, in order
    hit_lines: list[tuple[int, str]] = Field(default_factory=empty_list)  # lines holding a keyword
    head: list[str] = Field(default_factory=empty_list)
    tail: list[str] = Field(default_factory=empty_list)
    line_count: int = 0
    byte_count: int = 0
    binary: bool = False
    recognised: bool = False  # saw at least one vLLM or PyTorch line

    def get(self, name: str, default: Any = None) -> Any:
        fact = self.facts.get(name)
        return fact.value if fact is not None else default

    def line_of(self, name: str) -> str | None:
        fact = self.facts.get(name)
        return fact.line if fact is not None else None

    def furthest_marker(self) -> str | None:
        reached = [s for s in STAGES if s in self.markers]
        return reached[-1] if reached else None


@dataclass
class _State:
    facts: dict[str, Fact] = field(default_factory=dict)
    markers: dict[str, int] = field(default_factory=dict)
    frame_stages: list[str] = field(default_factory=list)
    errors: list[Fact] = field(default_factory=list)
    process_gib: dict[str, float] = field(default_factory=dict)
    recognised: bool = False

    def put(self, name: str, value: Any, line: str, line_no: int, keep: str = "first") -> None:
        """keep: first | last | min | max, for values printed by several workers or runs."""
        old = self.facts.get(name)
        if old is not None:
            if keep == "first":
                return
            if keep == "min" and not value < old.value:
                return
            if keep == "max" and not value > old.value:
                return
        self.facts[name] = Fact(value=value, line=line.strip()[:600], line_no=line_no)

    def mark(self, stage: str, line_no: int) -> None:
        self.markers.setdefault(stage, line_no)

    def add_error(self, name: str, line: str, line_no: int) -> None:
        self.errors.append(Fact(value=name, line=line.strip()[:600], line_no=line_no))

    def apply(self, fmt: LogFormat, m: re.Match[str], line: str, n: int) -> None:
        """What one match of `fmt` yields: its puts in order, then its handler, then its stage."""
        g = m.groups()
        for put in fmt.puts:
            if put.groups:
                args = [g[i] for i in put.groups]
                if not any(args):
                    continue  # an optional clause this version of the message leaves out
                value = put.convert(*args)  # type: ignore[misc]
            else:
                value = put.value
            self.put(put.fact, value, line, n, keep=put.keep)
        if fmt.handler is not None:
            HANDLERS[fmt.handler](self, m, line, n)
        if fmt.marks is not None:
            self.mark(fmt.marks, n)


FRAME_ORDER = {s: i for i, s in enumerate(STAGES)}


# ---- the pass -----------------------------------------------------------------------------


def _iter_chunks(log: LogText) -> Iterator[bytes]:
    if log.path is not None:
        with open(log.path, "rb") as fh:
            while True:
                block = fh.read(CHUNK_BYTES)
                if not block:
                    return
                yield block
    else:
        data = (log.text or "").encode("utf-8", errors="replace")
        for i in range(0, len(data), CHUNK_BYTES):
            yield data[i : i + CHUNK_BYTES]


try:  # Aho-Corasick in Rust: one scan for all keywords (100 MB in ~0.25 s)
    import ahocorasick_rs
except ImportError:  # pragma: no cover - the pure-Python path is slower, not different
    ahocorasick_rs = None  # type: ignore[assignment]


# The Rust crate's SIMD searcher (Teddy) takes at most 64 patterns, and only for leftmost
# match kinds; past that it falls back to a plain automaton 5-10x slower (100 MB: 0.02-0.05 s
# against 0.2-0.4 s per scan). So the keywords are scanned in groups of this size.
PACKED_PATTERNS = 64


def _without_superstrings(keywords: list[bytes]) -> list[bytes]:
    """The keywords that hold no other one (distinct keywords in); 1 ms for 154 in Rust, 7 ms in Python."""
    if ahocorasick_rs is None:  # pragma: no cover - same result, slower
        return [kw for kw in keywords if not any(other in kw and other != kw for other in keywords)]
    automaton = ahocorasick_rs.BytesAhoCorasick(keywords)  # the standard match kind: every overlapping match
    return [kw for i, kw in enumerate(keywords)
            if all(j == i for j, _, _ in automaton.find_matches_as_indexes(kw, overlapping=True))]


class KeywordScanner:
    """Finds the start offsets of the lines of a byte chunk that hold any keyword.

    A keyword never spans a newline (one holding one could never be on a line, so it is left
    out), so a leftmost, non-overlapping scan reports at least one match on every line that
    holds a keyword: a match ends on the line it starts on, and the scan resumes there."""

    def __init__(self, keywords: list[bytes]):
        # a keyword holding another one finds no line the other does not: left out, so fewer packed
        # searchers (passes over the log, 0.02-0.05 CPU-s per 100 MB each) are needed: 154
        # literals were 127, two searchers instead of three (issue 20)
        self.keywords = _without_superstrings([kw for kw in dict.fromkeys(keywords) if kw and b"\n" not in kw])
        # as few searchers as the cap allows, the keywords shared evenly between them: a searcher's
        # false candidates (positions its fingerprints match, then checked) grow with its keywords,
        # so 44, 44 and 45 cost less than 64, 64 and 5 (the realistic 100 MB log's three passes: 0.072
        # CPU-s against 0.084, medians of 7 interleaved, load 11; keyword-on-every-line: the same; issue 20)
        searchers = -(-len(self.keywords) // PACKED_PATTERNS)
        bounds = [len(self.keywords) * i // searchers for i in range(searchers + 1)] if searchers else []
        self.groups = [self.keywords[start:end] for start, end in zip(bounds, bounds[1:])]  # sizes within one
        self.automata = [ahocorasick_rs.BytesAhoCorasick(group, matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)
                         for group in self.groups] if ahocorasick_rs else []

    def match_starts(self, chunk: bytes) -> list[int]:
        """Where keywords start in the chunk (at least one per line holding any), ascending."""
        if not self.automata:
            return self._python_starts(chunk)
        starts = [start for automaton in self.automata for _, start, _ in automaton.find_matches_as_indexes(chunk)]
        if len(self.automata) > 1:
            starts.sort()
        return starts

    def _python_starts(self, chunk: bytes) -> list[int]:
        found: list[int] = []
        for kw in self.keywords:
            pos = chunk.find(kw)
            while pos != -1:
                found.append(pos)
                end = chunk.find(b"\n", pos)
                if end == -1:
                    break
                pos = chunk.find(kw, end)
        return sorted(found)

    def line_starts(self, chunk: bytes) -> list[int]:
        starts: list[int] = []
        line_end = -1
        for pos in self.match_starts(chunk):
            if pos > line_end:
                starts.append(chunk.rfind(b"\n", 0, pos) + 1)
                end = chunk.find(b"\n", pos)
                line_end = end if end != -1 else len(chunk)
        return starts


def trusted_text(text: str) -> str:
    """A line up to its first request payload marker (all of it when it has none); "" when
    nothing but prefixes comes before the marker: a request payload line."""
    if not may_hold_mark(text):  # most lines: no mark possible
        return text
    if PAYLOAD_LINE.match(text) is not None:  # one anchored match, not a search of a long line
        return ""
    return _before_first_mark(text)


def _before_first_mark(text: str) -> str:
    """`trusted_text` of a text PAYLOAD_LINE does not match."""
    if first_mark(text) is None:  # the common case, one search (kept for the line's other readers)
        return text
    start, end = message_span(text)
    return text[:end].rstrip() if end > start and text[start:end].strip() else ""


def trusted_parts(raw: bytes) -> list[str]:
    """`trusted_text` of each of the line's `_clean` parts, none for a request payload line (most
    lines a keyword finds in a busy log are request payloads quoting a prompt). The common one-part line is decoded once and matched once: the two
    steps decoded it twice and matched it against PAYLOAD_LINE twice (issue 20). A line holding
    none of PAYLOAD_LITERALS cannot match PAYLOAD_LINE (each mark holds one of them)."""
    text = raw.decode("utf-8", errors="replace")
    if "\r" in text or "\x1b[" in text:
        return [trusted_text(part) for part in _clean(raw)]
    line = text[:MAX_LINE_CHARS]
    if not may_hold_mark(line):
        return [line]
    if PAYLOAD_LINE.match(line) is not None:
        return []
    return [_before_first_mark(line)]


def _clean(raw: bytes) -> list[str]:
    """One physical line may hold several \r-separated tqdm frames; keep each."""
    text = raw.decode("utf-8", errors="replace")
    if "\x1b[" in text:
        text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    parts = [p for p in text.split("\r") if p.strip()] if "\r" in text else [text]
    return [p[:MAX_LINE_CHARS] for p in parts]


PLAIN_SEGMENT_BYTES = 1024 * 1024  # a head or tail decoded at once up to this size (bounded memory)


def _plain_lines(segment: bytes) -> list[str] | None:
    """Each line's `_clean` part through `trusted_text`, the segment decoded at once (decoding
    with replacement splits at newlines as line-by-line decoding does): None when a line needs
    `_clean`'s work (\r frames, colour codes) or the segment is large. A line per line, with the
    marks' search only on the lines holding a literal the segment holds: the head and the tail
    were ~10% of a diagnosis line by line (issue 20)."""
    if len(segment) > PLAIN_SEGMENT_BYTES:
        return None
    text = segment.decode("utf-8", errors="replace")
    if "\r" in text or "\x1b[" in text:
        return None
    lines = [line[:MAX_LINE_CHARS] for line in text.split("\n")]
    for number in _lines_holding(text, [literal for literal in PAYLOAD_LITERALS if literal in text]):
        lines[number] = trusted_text(lines[number])
    return lines


def _lines_holding(text: str, literals: list[str]) -> set[int]:
    """The numbers (from 0) of the text's lines holding any of `literals` (none holds a newline),
    found where the literals are, not by testing every line."""
    numbers: set[int] = set()
    for literal in literals:
        number, counted_to, at = 0, 0, text.find(literal)
        while at != -1:
            number += text.count("\n", counted_to, at)
            numbers.add(number)
            counted_to = text.find("\n", at)  # the line's end: its other occurrences add nothing
            at = text.find(literal, counted_to) if counted_to != -1 else -1
    return numbers


def _cap_line(line: bytes) -> bytes:
    """An over-long line cut to its first and last LINE_KEEP_BYTES, joined as two \r-separated
    parts (each part of a line is parsed on its own); the end starts at a progress-bar frame
    when it holds one, so the last frame is whole."""
    if len(line) <= MAX_LINE_BYTES:
        return line
    end = line[-LINE_KEEP_BYTES:]
    frame = end.find(b"\r")
    return line[:LINE_KEEP_BYTES] + b"\r" + (end[frame + 1 :] if frame != -1 else end)


def _mapped_blocks(mapped: mmap.mmap) -> Iterator[bytes]:
    """Exactly the blocks `_whole_lines` makes of the file's chunks, sliced from its mapping: each
    byte is copied once, where read() + joining the carry + cutting at the last newline copied it
    three times (0.07 of 0.42 CPU-s per 100 MB, issue 20). While the lines are short, a block is
    the file from where the last one ended to the last newline of the next chunk, which is what
    `_whole_lines` joins; from the first chunk that needs capping (no newline in it, or a first
    line over MAX_LINE_BYTES) on, `_whole_lines` itself reads the rest, chunk by chunk."""
    size, start, released = len(mapped), 0, 0
    for chunk_end in range(CHUNK_BYTES, size + CHUNK_BYTES, CHUNK_BYTES):
        chunk_end = min(chunk_end, size)
        cut = mapped.rfind(b"\n", start, chunk_end)
        if cut == -1 or mapped.find(b"\n", start, chunk_end) - start > MAX_LINE_BYTES:
            rest = (mapped[at : at + CHUNK_BYTES] for at in range(chunk_end, size, CHUNK_BYTES))
            yield from _whole_lines(itertools.chain([mapped[start:chunk_end]], rest))
            return
        yield mapped[start : cut + 1]
        start = cut + 1
        released = _release(mapped, released, start)
    if start < size:
        yield mapped[start:size] + b"\n"


def _release(mapped: mmap.mmap, released: int, upto: int) -> int:
    """Drop the pages read so far from this process's resident memory (they stay in the page
    cache), so the peak RSS does not grow with the size of the log; returns the new mark."""
    upto -= upto % mmap.PAGESIZE
    if upto > released and hasattr(mapped, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED, released, upto - released)
        return upto
    return released


def _map(fh: Any) -> mmap.mmap | None:
    """A read-only mapping of the open file; None for what cannot be mapped (an empty file, a pipe)."""
    try:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None


def _whole_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Newline-terminated blocks of whole lines; a line longer than MAX_LINE_BYTES is capped
    while it is read, so memory stays bounded however long it gets."""
    carry = b""
    for chunk in chunks:
        data = carry + chunk
        cut = data.rfind(b"\n")
        if cut == -1:
            carry = _cap_line(data)
            continue
        first_end = data.find(b"\n")
        if first_end > MAX_LINE_BYTES:  # a line begun in earlier chunks ends here
            data = _cap_line(data[:first_end]) + data[first_end:]
            cut = data.rfind(b"\n")
        yield data[: cut + 1]
        carry = data[cut + 1 :]
    if carry:
        yield carry + b"\n"


@functools.lru_cache(maxsize=8)
def _scanner(literals: tuple[str, ...]) -> KeywordScanner:
    """One scanner per keyword set (the built-in keywords plus one playbook set's literals):
    building its automata cost more than scanning a typical log, at every alert. A scanner is
    read-only once built, so the workers share it."""
    return KeywordScanner([k.encode() for k in literals])


class _Reader:
    """What one pass over a log has kept so far."""

    def __init__(self, literals: list[str]):
        self.scanner = _scanner(tuple(literals))
        self.shapes: dict[bytes, int] = {}
        self.state = _State()
        self.head: list[str] = []
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        # the raw tails of the last blocks, decoded only when a later block cannot push them out
        self.pending_tails: deque[bytes] = deque()
        # the lines playbooks may search: the first ones (start-up) and the last ones (the crash)
        self.hits: list[tuple[int, str]] = []
        self.late_hits: deque[tuple[int, str]] = deque(maxlen=MAX_STORED_HITS)
        self.line_base = 0
        self.total_bytes = 0
        self.binary = False

    def blocks(self, log: LogText) -> Iterator[bytes]:
        """The log as blocks of whole lines: a file through its mapping when it can be mapped."""
        if log.path is not None:
            with open(log.path, "rb") as fh:
                mapped = _map(fh)
                if mapped is not None:
                    with mapped:
                        self.total_bytes = len(mapped)
                        if _binary_start(mapped[:8192]):
                            self.total_bytes = min(len(mapped), CHUNK_BYTES)  # as counted chunk by chunk
                            self.binary = True
                            return
                        yield from _mapped_blocks(mapped)
                    return
        yield from _whole_lines(self.chunks(log))

    def chunks(self, log: LogText) -> Iterator[bytes]:
        """The log's byte chunks, counted; none at all when the first one looks binary."""
        for i, chunk in enumerate(_iter_chunks(log)):
            self.total_bytes += len(chunk)
            if i == 0 and _binary_start(chunk[:8192]):
                self.binary = True
                return
            yield chunk

    def consume(self, block: bytes) -> None:
        """A block of whole lines."""
        if not block:
            return
        if len(self.head) < HEAD_LINES:
            raws = block.split(b"\n", HEAD_LINES)[:HEAD_LINES - len(self.head)]
            plain = _plain_lines(b"\n".join(raws))
            if plain is not None:
                self.head.extend(plain)
            else:
                for raw in raws:  # each line's first part (a line of blank \r frames: "")
                    self.head.extend([trusted_text(t) for t in _clean(raw)[:1]] or [""])
        self._parse_hits(block)
        self.line_base += block.count(b"\n")
        # tail: the last lines of the stream (this block's end is enough: TAIL_LINES << chunk)
        tail_start = len(block)
        for _ in range(TAIL_LINES + 1):
            tail_start = block.rfind(b"\n", 0, tail_start)
            if tail_start <= 0:
                tail_start = 0
                break
        self._defer_tail(block[tail_start:])

    def _defer_tail(self, segment: bytes) -> None:
        """Keep a block's last lines undecoded: most blocks' tails are pushed out of the tail by
        the next block's, so decoding them would be wasted work (300 lines per 2 MiB)."""
        if b"\r" not in segment and segment.count(b"\n") >= TAIL_LINES:
            self.pending_tails.clear()  # each of its pieces is one tail entry: it fills the tail alone
        self.pending_tails.append(segment)
        while len(self.pending_tails) > 2:  # bounded: a tail of \r-only lines may need older blocks
            self._take_tail(self.pending_tails.popleft())

    def _take_tail(self, segment: bytes) -> None:
        plain = _plain_lines(segment)
        if plain is not None:
            self.tail.extend(plain)
            return
        for raw in segment.split(b"\n"):
            for text in _clean(raw)[-1:]:
                self.tail.append(trusted_text(text))

    def _parse_hits(self, block: bytes) -> None:
        """Parse the lines holding a literal; a line shape repeated REPEATS_PARSED times is noise."""
        # line numbers: newlines counted (bytes.count, C speed) up to each line that is parsed
        counted_to, line_no = 0, self.line_base
        for start in self.scanner.line_starts(block):
            end = block.find(b"\n", start)
            raw = block[start : end if end != -1 else len(block)]
            if self._is_noise(raw):
                continue
            for text in trusted_parts(raw):
                if not text:
                    continue  # a request payload line: a user's text, never evidence
                line_no += block.count(b"\n", counted_to, start)
                counted_to = start
                self._parse_text(text, line_no + 1, block, end)

    def _is_noise(self, raw: bytes) -> bool:
        """Count the line's shape (its start without digits); True past REPEATS_PARSED."""
        shape = raw[:160].translate(None, b"0123456789")
        seen = self.shapes.get(shape, 0)
        if not seen and len(self.shapes) >= MAX_SHAPES:
            self._evict_shapes()
        self.shapes[shape] = seen + 1
        return seen >= REPEATS_PARSED

    def _parse_text(self, text: str, n: int, block: bytes, end: int) -> None:
        missed = _parse_line(self.state, text, n)
        if missed and end != -1:
            # a message wrapped over lines (a terminal or a paste): retry with what follows
            following = block[end + 1 : end + 1 + 2048].split(b"\n", 2)[:2]
            joined = re.sub(r"\s+", " ", " ".join([text] + _continuation([(_clean(f) or [""])[-1] for f in following])))
            # the message's later pieces that only the continuation holds (PyTorch's per-process
            # list after its OOM sentence) are read with it, so they count as that message's
            _parse_line(self.state, joined, n, only=missed | _pieces_only_in(joined, text))
        hits = self.hits if len(self.hits) < MAX_STORED_HITS else self.late_hits
        hits.append((n, text.strip()))

    def _evict_shapes(self) -> None:
        """Make room in the full shape table: amortised O(1) per line, as it frees half of it."""
        noise = [(count, shape) for shape, count in self.shapes.items() if count >= REPEATS_PARSED]
        noise.sort(reverse=True)
        self.shapes = {shape: count for count, shape in noise[: MAX_SHAPES // 2]}

    def result(self) -> LogFacts:
        while self.pending_tails:
            self._take_tail(self.pending_tails.popleft())
        state = self.state
        if state.process_gib:
            first_oom = state.facts["oom_tried_gib"]
            state.facts["oom_processes_gib"] = Fact(value=list(state.process_gib.values()),
                                                    line=first_oom.line, line_no=first_oom.line_no)
        return LogFacts(
            facts=state.facts,
            markers=state.markers,
            frame_stages=state.frame_stages,
            errors=state.errors,
            hit_lines=self.hits + list(self.late_hits),
            head=self.head,
            tail=[t for t in self.tail if t.strip()],
            line_count=self.line_base,
            byte_count=self.total_bytes,
            binary=self.binary,
            recognised=state.recognised or bool(state.facts)
            or any(_VLLM_LINE.search(h) for h in self.head + list(self.tail)),
        )


def _continuation(lines: list[str]) -> list[str]:
    """The lines a wrapped message may continue onto, up to the first request payload marker."""
    kept: list[str] = []
    for line in lines:
        trusted = trusted_text(line)
        if trusted:
            kept.append(trusted)
        if trusted != line:
            break
    return kept


def extract(log: LogText, extra_literals: Iterable[str] = ()) -> LogFacts:
    """Read the log once and return what it says."""
    literals = list(dict.fromkeys(list(KEYWORDS) + [x for x in extra_literals if x]))
    reader = _Reader(literals)
    for block in reader.blocks(log):
        reader.consume(block)
    return reader.result()


_VLLM_LINE = re.compile(
    r"(?:^|\) )(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d|vllm[./]|torch\.|CUDA|Traceback \(most recent")


# control bytes other than tab, newline, vertical tab, form feed and carriage return
_CONTROL_BYTES = bytes(b for b in range(32) if b < 9 or 13 < b < 32)


def _binary_start(sample: bytes) -> bool:
    """The first 8 KiB of a log say it is not text: nothing of it is read."""
    return b"\x00" in sample or _mostly_binary(sample)


def _mostly_binary(sample: bytes) -> bool:
    if not sample:
        return False
    control = len(sample) - len(sample.translate(None, _CONTROL_BYTES))  # counted in C, not byte by byte
    try:
        sample.decode("utf-8")
        return control > len(sample) * 0.05
    except UnicodeDecodeError as exc:
        # a multibyte char cut at the sample's end is fine
        return exc.start < len(sample) - 4 or control > len(sample) * 0.05


_PARSERS_BY_GATE = {g: [i for i, fmt in enumerate(FORMATS) if g in fmt.literals] for g in KEYWORDS}
_GATE_AUTOMATON = ahocorasick_rs.AhoCorasick(KEYWORDS) if ahocorasick_rs else None
WRAPPABLE = {fmt.name for fmt in FORMATS if fmt.wrappable}


_WRAPPABLE_LITERALS = [(i, fmt.literals) for i, fmt in enumerate(FORMATS) if fmt.name in WRAPPABLE]


def _pieces_only_in(joined: str, first: str) -> set[int]:
    """The wrappable formats whose literal a joined message holds and its first line does not."""
    return {i for i, literals in _WRAPPABLE_LITERALS if any(g in joined and g not in first for g in literals)}


def _parse_line(state: _State, line: str, n: int, only: set[int] | None = None) -> set[int]:
    """Run the formats whose literals the line's message holds; return the wrappable ones that
    did not match. Each regex sees only the message (see `message_span`): a format cannot match
    in a prefix or in a request payload, and `^` is where vLLM's or PyTorch's message starts."""
    start, end = message_span(line)
    line = line[:end]
    message = line[start:]
    if only is not None:
        todo = sorted(only)
    elif _GATE_AUTOMATON is not None:
        gates = _GATE_AUTOMATON.find_matches_as_strings(message, overlapping=True)
        todo = sorted({i for g in gates for i in _PARSERS_BY_GATE[g]})
    else:
        todo = [i for i, fmt in enumerate(FORMATS) if any(g in message for g in fmt.literals)]
    missed: set[int] = set()
    for i in todo:  # in FORMATS order: a line's OOM total comes before its process list
        fmt = FORMATS[i]
        m = fmt.regex.search(message)
        if m:
            state.apply(fmt, m, line, n)
        elif fmt.wrappable and only is None:
            missed.add(i)
    return missed
