"""The options of plasmid-tools, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from pathlib import Path

from plasmid.errors import UsageError
from plasmid.options import Options, option

#: The document files ``retrieve`` reads, by suffix.
DOC_SUFFIXES = (".jsonl", ".txt")


class CalculatorOptions(Options, group="calculator", description="the 'calculator' tool: safe arithmetic"):
    calculator_max_length: int = option(1000, "longest expression accepted (characters)", min=1)
    calculator_max_digits: int = option(1000, "most decimal digits of an integer, in the expression or any "
                                              "intermediate result", min=1, max=4000)
    calculator_max_exponent: int = option(10000, "largest absolute integer exponent of '**'", min=1)
    calculator_max_depth: int = option(50, "deepest nesting of operations and calls", min=1, max=200)


class RetrieveOptions(Options, group="retrieve", description="the 'retrieve' tool: BM25 over a local document file"):
    retrieve_docs: Path | None = option(None, "the documents 'retrieve' searches: a .jsonl file (one object a line, "
                                              "text under --retrieve-text-key) or a .txt file (one document a "
                                              "paragraph, paragraphs separated by blank lines)", metavar="PATH")
    retrieve_text_key: str = option("text", "the key of a document's text in a .jsonl --retrieve-docs")
    retrieve_k: int = option(3, "documents returned when the call gives no 'k'", min=1)
    retrieve_max_k: int = option(10, "most documents one call may ask for", min=1)
    retrieve_doc_chars: int = option(2000, "characters shown of each returned document (longer ones are cut)",
                                     min=1)
    retrieve_bm25_k1: float = option(1.5, "BM25 term-frequency saturation k1", min=0)
    retrieve_bm25_b: float = option(0.75, "BM25 length normalisation b", min=0, max=1)

    def check(self) -> None:
        if self.retrieve_k > self.retrieve_max_k:
            raise UsageError(f"--retrieve-k {self.retrieve_k}: more than --retrieve-max-k {self.retrieve_max_k}")
        if not self.retrieve_text_key:
            raise UsageError("--retrieve-text-key '': give the key of a document's text, such as text")
        path = self.retrieve_docs
        if path is not None and path.suffix.lower() not in DOC_SUFFIXES:
            raise UsageError(f"--retrieve-docs {path}: unsupported file type '{path.suffix}'; use one of "
                             f"{', '.join(DOC_SUFFIXES)}")
