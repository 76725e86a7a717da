"""Every hook is documented where it is declared, and every hook is exercised by a test."""

import inspect
import re
from pathlib import Path

import pytest

from plasmid import hookspecs

HOOKS = sorted(name for name in dir(hookspecs) if name.startswith("plasmid_"))
REPO = Path(__file__).resolve().parents[2]


def test_there_are_hooks_of_every_kind():
    assert {"plasmid_addoption", "plasmid_configure", "plasmid_rewards", "plasmid_metrics"} <= set(HOOKS)


@pytest.mark.parametrize("hook", HOOKS)
def test_hookspec_docstring_covers_every_parameter(hook):
    function = getattr(hookspecs, hook)
    doc = inspect.getdoc(function)
    assert doc and len(doc.splitlines()[0]) > 10, f"{hook} has no summary line"
    for parameter in inspect.signature(function).parameters:
        assert re.search(rf":param {parameter}:", doc), f"{hook} does not document :param {parameter}:"


@pytest.mark.parametrize("hook", HOOKS)
def test_hookspec_is_exercised_by_some_test(hook):
    this = Path(__file__).resolve()
    test_files = [p for pattern in ("core/tests/test_*.py", "tests/test_*.py", "plugins/*/*/tests/test_*.py")
                  for p in REPO.glob(pattern) if p.resolve() != this]
    users = [p for p in test_files if hook in p.read_text()]
    assert users, f"no test mentions {hook}; add one that implements it and checks it is called"


def test_hookspecs_are_typed():
    for hook in HOOKS:
        signature = inspect.signature(getattr(hookspecs, hook))
        for name, parameter in signature.parameters.items():
            assert parameter.annotation is not inspect.Parameter.empty, f"{hook}({name}) has no type"
