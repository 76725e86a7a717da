"""Each tool of plasmid-tools keeps the tool contract."""

from __future__ import annotations

from pathlib import Path

import plasmid_basic_tools.plugin

from plasmid.testing import ToolContract

DOCS = Path(__file__).with_name("data") / "docs.jsonl"


class TestCalculatorContract(ToolContract):
    plugin = plasmid_basic_tools.plugin
    provider = "calculator"
    valid_arguments = [{"expression": "2 * (3 + 4)"}, {"expression": "2 ** 100 // 3"}, {"expression": "sqrt(2)"}]
    invalid_arguments = [{}, {"expression": "2 *"}, {"expression": "9**9**9"}, {"expression": "__import__('os')"},
                         {"expression": 7}]


class TestRetrieveContract(ToolContract):
    plugin = plasmid_basic_tools.plugin
    provider = "retrieve"
    config_options = {"retrieve_docs": DOCS}
    valid_arguments = [{"query": "capital of France"}, {"query": "highest mountain", "k": 1},
                       {"query": "nothing like this"}]
    invalid_arguments = [{}, {"query": ""}, {"query": "paris", "k": 0}, {"query": "paris", "k": "3"}]
