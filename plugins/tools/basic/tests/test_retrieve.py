"""retrieve ranks the documents of a local file with BM25 and returns the best as text; the file is
read and indexed once, and a file that cannot be used is a one-line start-up error."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import plasmid_basic_tools.plugin
import pytest
from plasmid_basic_tools.retrieve import BM25Index, Retrieve, _cached, load_documents, read_documents, tokenize

from plasmid.errors import UsageError
from plasmid.protocols import Tool, ToolError
from plasmid.testing import build, make_config, run
from plasmid.types import Sample

DATA = Path(__file__).with_name("data")
JSONL = DATA / "docs.jsonl"
TXT = DATA / "docs.txt"


def retrieve(path: Path = JSONL, **options) -> Retrieve:
    config = make_config(plasmid_basic_tools.plugin, retrieve_docs=path, **options)
    return build("tool", "retrieve", plasmid_basic_tools.plugin, config=config)


def call(tool: Retrieve, **arguments) -> str:
    return run(tool(arguments, Sample()))


def test_it_is_a_tool_with_a_one_line_description_and_a_schema():
    tool = retrieve()
    assert isinstance(tool, Tool) and tool.name == "retrieve"
    assert tool.description and "\n" not in tool.description
    assert tool.parameters["required"] == ["query"]
    assert set(tool.parameters["properties"]) == {"query", "k"}


def test_the_best_documents_come_first_numbered():
    answer = call(retrieve(), query="France", k=2)
    first, second = answer.split("\n\n")
    assert first.startswith("[1] Paris is the capital")
    assert second.startswith("[2] The Eiffel Tower")


def test_k_defaults_to_the_option_and_only_matching_documents_are_returned():
    tool = retrieve(retrieve_k=1)
    assert call(tool, query="highest mountain").startswith("[1] Mount Everest")
    assert "[2]" not in call(tool, query="highest mountain")
    assert call(retrieve(), query="mountain", k=5).count("[") == 1
    assert call(retrieve(), query="zebra quantum") == "no document matches the query"


def test_a_txt_file_is_one_document_a_paragraph():
    assert load_documents(TXT) == [
        "Python is a high-level programming language. Its design emphasises code readability.",
        "Rust is a systems programming language focused on memory safety\nwithout a garbage collector.",
        "The Amazon is the largest rainforest on Earth, spanning nine countries.",
    ]
    assert call(retrieve(TXT), query="memory safety garbage", k=1).startswith("[1] Rust")


def test_the_text_key_is_an_option(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"body": "alpha beta"}\n{"body": "gamma delta"}\n')
    assert call(retrieve(path, retrieve_text_key="body"), query="gamma") == "[1] gamma delta"


def test_long_documents_are_cut(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("needle " + "hay " * 1000)
    assert call(retrieve(path, retrieve_doc_chars=20), query="needle") == "[1] needle hay hay hay h ..."


def test_scores_are_bm25():
    documents = ["a b b", "a c", "c c c d"]
    index = BM25Index(documents, k1=1.2, b=0.75)
    average = (3 + 2 + 4) / 3

    def term(tf: int, length: int, df: int) -> float:
        idf = math.log(1 + (3 - df + 0.5) / (df + 0.5))
        return idf * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * length / average))

    hits = index.search("b c", 3)
    expected = {0: term(2, 3, 1), 1: term(1, 2, 2), 2: term(3, 4, 2)}
    assert [hit.index for hit in hits] == sorted(expected, key=lambda i: -expected[i])
    for hit in hits:
        assert hit.score == pytest.approx(expected[hit.index])
    assert tokenize("Héllo, WORLD-42!") == ["héllo", "world", "42"]


def test_ties_keep_file_order():
    assert [hit.index for hit in BM25Index(["x y", "x z", "x w"]).search("x", 3)] == [0, 1, 2]


@pytest.mark.parametrize(("arguments", "reason"), [
    ({}, "give the query"),
    ({"query": ""}, "give the query"),
    ({"query": 3}, "give the query"),
    ({"query": "paris", "k": 0}, "k must be an integer from 1 to 10"),
    ({"query": "paris", "k": 11}, "k must be an integer from 1 to 10"),
    ({"query": "paris", "k": "2"}, "k must be an integer"),
    ({"query": "paris", "k": True}, "k must be an integer"),
    ({"query": "paris", "top": 2}, "unknown argument 'top'"),
    ({"query": "x" * 5000}, "query too long"),
])
def test_wrong_arguments_are_a_short_tool_error(arguments, reason):
    with pytest.raises(ToolError) as raised:
        run(retrieve()(arguments, Sample()))
    assert reason in str(raised.value)


def test_k_given_as_a_whole_float_is_accepted():
    assert call(retrieve(), query="paris", k=1.0).count("[") == 1


def test_concurrent_searches_share_the_index():
    tool = retrieve()

    async def many():
        return await asyncio.gather(*(tool({"query": q, "k": 1}, Sample()) for q in ["paris", "plants"] * 10))

    answers = run(many())
    assert all(a.startswith("[1] Paris") for a in answers[0::2])
    assert all(a.startswith("[1] Photosynthesis") for a in answers[1::2])


@pytest.mark.parametrize(("content", "suffix", "message"), [
    ("", ".jsonl", "the file has no documents"),
    ("\n\n  \n", ".txt", "the file has no documents"),
    ('{"text": ""}\n', ".jsonl", "the file has no documents"),
    ('{"text": "a"}\n{"text": \n', ".jsonl", "docs.jsonl:2: malformed JSON"),
    ('{"body": "a"}\n', ".jsonl", "docs.jsonl:1: the row has no 'text' key (--retrieve-text-key); its keys: 'body'"),
    ('[1, 2]\n', ".jsonl", "docs.jsonl:1: expected an object with a 'text' field, got list"),
    ('{"text": 5}\n', ".jsonl", "docs.jsonl:1: 'text' must be a string, got int"),
])
def test_an_unusable_file_is_a_one_line_usage_error_when_the_tool_is_built(tmp_path, content, suffix, message):
    path = tmp_path / f"docs{suffix}"
    path.write_text(content)
    with pytest.raises(UsageError) as raised:
        retrieve(path)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_file_that_is_not_utf8_is_a_usage_error(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_bytes(b"caf\xe9\n")
    with pytest.raises(UsageError, match="not UTF-8 text"):
        retrieve(path)


def test_without_docs_the_tool_cannot_be_built():
    with pytest.raises(UsageError, match="--tools retrieve needs --retrieve-docs PATH"):
        build("tool", "retrieve", plasmid_basic_tools.plugin)


@pytest.mark.parametrize(("options", "message"), [
    ({}, "--tools retrieve needs --retrieve-docs PATH (a .jsonl or .txt file of documents)"),
    ({"retrieve_docs": Path("/nonexistent/docs.jsonl")}, "--retrieve-docs /nonexistent/docs.jsonl: no such file"),
])
def test_choosing_retrieve_checks_its_file_at_start_up(options, message):
    with pytest.raises(UsageError) as raised:
        make_config(plasmid_basic_tools.plugin, tools=["retrieve"], **options)
    assert str(raised.value) == message


def test_an_empty_file_is_a_start_up_error(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("")
    with pytest.raises(UsageError, match="the file has no documents"):
        make_config(plasmid_basic_tools.plugin, tools=["calculator,retrieve"], retrieve_docs=path)


@pytest.mark.parametrize(("content", "message"), [
    ("\n\n  \n", "the file has no documents"),
    ('{"text": "a"}\n{"body": "b"}\n', "docs.jsonl:2: the row has no 'text' key"),
])
def test_a_file_without_usable_documents_is_a_start_up_error(tmp_path, content, message):
    path = tmp_path / "docs.jsonl"
    path.write_text(content)
    with pytest.raises(UsageError, match=message):
        make_config(plasmid_basic_tools.plugin, tools=["retrieve"], retrieve_docs=path)


def test_the_file_is_read_once_while_it_is_unchanged(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("alpha\n\nbeta")
    assert read_documents(path) == ["alpha", "beta"] and read_documents(path) is not read_documents(path)
    config = make_config(plasmid_basic_tools.plugin, tools=["retrieve"], retrieve_docs=path)
    hits = _cached.cache_info().hits
    build("tool", "retrieve", plasmid_basic_tools.plugin, config=config)
    assert _cached.cache_info().hits > hits
    path.write_text("gamma delta epsilon")  # another size: a changed file even where mtimes are coarse
    assert read_documents(path) == ["gamma delta epsilon"]


def test_the_file_is_checked_only_when_retrieve_is_chosen():
    make_config(plasmid_basic_tools.plugin, tools=["calculator"])
