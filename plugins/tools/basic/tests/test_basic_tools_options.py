"""The options of plasmid-tools are declared once: a bad value is a one-line error naming its flag,
and the typed read gives the declared defaults."""

from __future__ import annotations

from pathlib import Path

import plasmid_basic_tools.plugin
import pytest
from plasmid_basic_tools.calculator import Calculator
from plasmid_basic_tools.options import CalculatorOptions, RetrieveOptions
from plasmid_basic_tools.retrieve import Retrieve

from plasmid.errors import UsageError
from plasmid.testing import make_config, make_registry


def test_the_typed_read_gives_the_declared_defaults():
    config = make_config(plasmid_basic_tools.plugin)
    calculator = CalculatorOptions.of(config)
    assert calculator == CalculatorOptions.defaults()
    assert (calculator.calculator_max_length, calculator.calculator_max_digits, calculator.calculator_max_exponent,
            calculator.calculator_max_depth) == (1000, 1000, 10000, 50)
    retrieve = RetrieveOptions.of(config)
    assert retrieve == RetrieveOptions.defaults()
    assert (retrieve.retrieve_docs, retrieve.retrieve_text_key, retrieve.retrieve_k, retrieve.retrieve_max_k,
            retrieve.retrieve_doc_chars, retrieve.retrieve_bm25_k1, retrieve.retrieve_bm25_b) == (
        None, "text", 3, 10, 2000, 1.5, 0.75)


def test_a_path_option_is_a_path():
    config = make_config(plasmid_basic_tools.plugin, retrieve_docs="docs.txt")
    assert RetrieveOptions.of(config).retrieve_docs == Path("docs.txt")


@pytest.mark.parametrize(("bad", "message"), [
    ({"calculator_max_length": 0}, "--calculator-max-length 0: must be >= 1"),
    ({"calculator_max_digits": 5000}, "--calculator-max-digits 5000: must be <= 4000"),
    ({"calculator_max_exponent": 0}, "--calculator-max-exponent 0: must be >= 1"),
    ({"calculator_max_depth": 500}, "--calculator-max-depth 500: must be <= 200"),
    ({"retrieve_k": 0}, "--retrieve-k 0: must be >= 1"),
    ({"retrieve_k": 11}, "--retrieve-k 11: more than --retrieve-max-k 10"),
    ({"retrieve_doc_chars": 0}, "--retrieve-doc-chars 0: must be >= 1"),
    ({"retrieve_bm25_b": 1.5}, "--retrieve-bm25-b 1.5: must be <= 1"),
    ({"retrieve_bm25_k1": -1.0}, "--retrieve-bm25-k1 -1.0: must be >= 0"),
    ({"retrieve_text_key": ""}, "--retrieve-text-key '': give the key of a document's text, such as text"),
    ({"retrieve_docs": "docs.csv"}, "--retrieve-docs docs.csv: unsupported file type '.csv'; use one of .jsonl, .txt"),
    ({"retrieve_max_k": "many"}, "--retrieve-max-k: expected int, got 'many'"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_its_flag(bad, message):
    with pytest.raises(UsageError) as raised:
        make_config(plasmid_basic_tools.plugin, **bad)
    assert str(raised.value) == message


def test_the_tools_list_the_options_they_read_and_are_registered():
    assert Calculator.option_classes == (CalculatorOptions,)
    assert Retrieve.option_classes == (RetrieveOptions,)
    registry = make_registry(plasmid_basic_tools.plugin)
    assert registry.get("tool", "calculator").load() is Calculator
    assert registry.get("tool", "retrieve").load() is Retrieve
