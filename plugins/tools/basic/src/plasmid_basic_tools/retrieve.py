"""The ``retrieve`` tool: Okapi BM25 over a local document file, in pure Python.

Documents come from ``--retrieve-docs``: a ``.jsonl`` file (one JSON object a line, its text under
``--retrieve-text-key``; blank lines are skipped) or a ``.txt`` file (one document a paragraph:
paragraphs are separated by one or more blank lines). With ``--tools retrieve`` the file is read
and checked at start-up (``plasmid_configure``), before anything is built or written, and the
index is built once, when the tool is built; a missing, unreadable or empty file, or a malformed
line, is a one-line :class:`~plasmid.errors.UsageError` naming the file (and line).

Text is tokenized as lower-cased runs of letters and digits (``\\w+``, Unicode-aware). A document's
score for a query is ``sum over query terms t of idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b *
len / avglen))`` with ``idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))`` (always positive; a query
term repeated counts once per repetition). The top ``k`` documents with a positive score are
returned, best first, ties in file order.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.options import Options
from plasmid.protocols import ToolError
from plasmid.types import Sample
from plasmid_basic_tools.options import DOC_SUFFIXES, RetrieveOptions

TOKEN = re.compile(r"\w+")
PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")
#: Longest query accepted (characters); longer ones are refused as a ToolError.
MAX_QUERY_CHARS = 4000
#: Above this many postings to score, a search runs in a thread instead of on the event loop.
INLINE_POSTINGS = 20_000


def tokenize(text: str) -> list[str]:
    """The terms of ``text``: lower-cased ``\\w+`` runs."""
    return TOKEN.findall(text.lower())


def load_documents(path: Path, text_key: str = "text") -> list[str]:
    """The documents of ``path`` (see the module docstring), in file order; a
    :class:`UsageError` naming ``--retrieve-docs`` and the file (and line) if it cannot be used."""
    flag = "--retrieve-docs"
    if path.suffix.lower() not in DOC_SUFFIXES:
        raise UsageError(f"{flag} {path}: unsupported file type '{path.suffix}'; use one of {', '.join(DOC_SUFFIXES)}")
    if not path.is_file():
        raise UsageError(f"{flag} {path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{flag} {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    if path.suffix.lower() == ".txt":
        documents = [part.strip() for part in PARAGRAPH_BREAK.split(text.replace("\r\n", "\n"))]
    else:
        documents = list(_jsonl_documents(path, text, text_key))
    documents = [document for document in documents if document]
    if not documents:
        raise UsageError(f"{flag} {path}: the file has no documents")
    return documents


@functools.lru_cache(maxsize=4)
def _cached(path: Path, text_key: str, stamp: tuple[int, int]) -> tuple[str, ...]:
    return tuple(load_documents(path, text_key))


def read_documents(path: Path, text_key: str = "text") -> list[str]:
    """:func:`load_documents`, read once per process while the file is unchanged (start-up checks
    the file and the tool then indexes the same documents without reading it again)."""
    try:
        info = path.stat()
    except OSError:
        return load_documents(path, text_key)  # the one-line error for a missing or unreadable path
    return list(_cached(path.resolve(), text_key, (info.st_mtime_ns, info.st_size)))


def _jsonl_documents(path: Path, text: str, key: str) -> list[str]:
    documents = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{number}: malformed JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(row, dict):
            raise UsageError(f"{path}:{number}: expected an object with a {key!r} field, got {type(row).__name__}")
        if key not in row:
            present = ", ".join(map(repr, list(row)[:8])) or "none"
            raise UsageError(f"{path}:{number}: the row has no {key!r} key (--retrieve-text-key); its keys: {present}")
        if not isinstance(row[key], str):
            raise UsageError(f"{path}:{number}: {key!r} must be a string, got {type(row[key]).__name__}")
        documents.append(row[key].strip())
    return documents


@dataclass(frozen=True)
class Hit:
    """One retrieved document: its position in the file (from 0), its text and BM25 score."""

    index: int
    text: str
    score: float


class BM25Index:
    """An inverted index of ``documents`` scored with Okapi BM25 (see the module docstring).

    Immutable once built, so concurrent searches are safe.
    """

    def __init__(self, documents: list[str], *, k1: float = 1.5, b: float = 0.75) -> None:
        self.documents = documents
        self.k1, self.b = k1, b
        self.postings: dict[str, list[tuple[int, int]]] = {}
        self.lengths: list[int] = []
        for index, document in enumerate(documents):
            counts = Counter(tokenize(document))
            self.lengths.append(sum(counts.values()))
            for term, count in counts.items():
                self.postings.setdefault(term, []).append((index, count))
        total = len(documents)
        self.average_length = (sum(self.lengths) / total) if total else 0.0
        self.idf = {term: math.log(1 + (total - len(docs) + 0.5) / (len(docs) + 0.5))
                    for term, docs in self.postings.items()}

    def cost(self, query: str) -> int:
        """How many postings a search for ``query`` scores."""
        return sum(len(self.postings.get(term, ())) for term in tokenize(query))

    def search(self, query: str, k: int) -> list[Hit]:
        """The ``k`` best documents for ``query`` with a positive score, best first (ties: file order)."""
        scores: dict[int, float] = {}
        k1, b, average = self.k1, self.b, self.average_length or 1.0
        for term in tokenize(query):
            idf = self.idf.get(term)
            if idf is None:
                continue
            for index, count in self.postings[term]:
                norm = k1 * (1 - b + b * self.lengths[index] / average)
                scores[index] = scores.get(index, 0.0) + idf * count * (k1 + 1) / (count + norm)
        best = heapq.nsmallest(k, scores.items(), key=lambda item: (-item[1], item[0]))
        return [Hit(index, self.documents[index], score) for index, score in best if score > 0]


class Retrieve:
    """``await retrieve({"query": "...", "k": 3}, sample)`` -> the top documents as numbered text.

    The index is built once, at construction (start-up), from ``--retrieve-docs``; searches share
    it and keep no state. A search that scores many postings runs in a thread so the event loop
    keeps serving other rollouts.
    """

    name = "retrieve"
    description = "Search the document collection: returns the documents most relevant to a query."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for, in words"},
            "k": {"type": "integer", "minimum": 1, "description": "how many documents to return"},
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    option_classes: ClassVar[tuple[type[Options], ...]] = (RetrieveOptions,)

    def __init__(self, config: Config) -> None:
        """Built once per run as ``retrieve(config)``: reads and indexes ``--retrieve-docs``
        (a :class:`UsageError` if it is not given or cannot be used)."""
        options = RetrieveOptions.of(config)
        if options.retrieve_docs is None:
            raise UsageError("--tools retrieve needs --retrieve-docs PATH (a .jsonl or .txt file of documents)")
        self.options = options
        self.index = BM25Index(read_documents(options.retrieve_docs, options.retrieve_text_key),
                               k1=options.retrieve_bm25_k1, b=options.retrieve_bm25_b)

    def arguments(self, arguments: dict[str, Any]) -> tuple[str, int]:
        """``(query, k)`` of a call; :class:`ToolError` with a short reason if they are wrong."""
        options = self.options
        if not isinstance(arguments, dict):
            raise ToolError('give the arguments as an object: {"query": "...", "k": 3}')
        extra = sorted(set(arguments) - {"query", "k"})
        if extra:
            raise ToolError(f"unknown argument{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))}; "
                            f"give \"query\" and optionally \"k\"")
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ToolError('give the query as a non-empty string: {"query": "..."}')
        if len(query) > MAX_QUERY_CHARS:
            raise ToolError(f"query too long ({len(query)} characters; at most {MAX_QUERY_CHARS})")
        k = arguments.get("k", options.retrieve_k)
        if isinstance(k, float) and k.is_integer():
            k = int(k)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= options.retrieve_max_k:
            raise ToolError(f"k must be an integer from 1 to {options.retrieve_max_k}, got {k!r}")
        return query, k

    def render(self, hits: list[Hit]) -> str:
        """The answer: ``[1] text`` per document, best first, each cut at ``--retrieve-doc-chars``."""
        if not hits:
            return "no document matches the query"
        limit = self.options.retrieve_doc_chars
        parts = [f"[{rank}] {hit.text if len(hit.text) <= limit else hit.text[:limit] + ' ...'}"
                 for rank, hit in enumerate(hits, 1)]
        return "\n\n".join(parts)

    async def __call__(self, arguments: dict[str, Any], sample: Sample) -> str:
        query, k = self.arguments(arguments)
        if self.index.cost(query) > INLINE_POSTINGS:
            hits = await asyncio.to_thread(self.index.search, query, k)
        else:
            hits = self.index.search(query, k)
        return self.render(hits)
