"""Reading a framework's settings from its installed source, without importing it, as options."""

import ast
import sys

import pytest

from plasmid.config import OptionParser
from plasmid.errors import UsageError
from plasmid_serving.native_options import (
    NativeField,
    add_options,
    class_fields,
    given_values,
    package_directory,
    parse_bool,
    scalar_kind,
)


@pytest.fixture
def package(tmp_path):
    """A fake package ``fw`` (never imported): a config class whose base lives in another module."""
    root = tmp_path / "fw"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("raise RuntimeError('importing fw is not allowed in this test')\n")
    (root / "base.py").write_text(
        "from dataclasses import dataclass\n@dataclass\nclass Base:\n"
        "    shared: int = 3\n    \"\"\"Shared. More.\"\"\"\n    replaced: str = 'base'\n")
    (root / "sub" / "config.py").write_text(
        "from dataclasses import dataclass, field\nfrom typing import Literal, Optional\nfrom fw.base import Base\n"
        "@dataclass\nclass Config(Base):\n    mode: Optional[Literal['a', 'b']] = None\n    ratio: float | None = 0.5\n"
        "    listed: list = field(default_factory=list)\n    required: int\n    replaced: str = 'mine'\n"
        "    _private: bool = False\n")
    return tmp_path, root


def test_fields_of_a_class_and_its_imported_base_are_read_from_source(package, monkeypatch):
    path, root = package
    monkeypatch.syspath_prepend(str(path))
    assert package_directory("fw") == root and package_directory("fw", marker="sub/config.py") == root
    assert package_directory("fw", marker="missing.py") is None and package_directory("no_such_fw") is None
    fields = class_fields(root / "sub" / "config.py", "Config", root=root, package="fw")
    assert [f.name for f in fields] == ["shared", "replaced", "mode", "ratio", "listed", "required"]
    by_name = {f.name: f for f in fields}
    assert by_name["shared"].doc == "Shared." and by_name["shared"].owner == "Config"
    assert by_name["replaced"].default == "'mine'", "a redefinition replaces the base's field"
    assert by_name["listed"].default is None and by_name["required"].default is None
    assert "fw" not in sys.modules


@pytest.mark.parametrize(("annotation", "expected"), [
    ("bool", ("bool", None)), ("Optional[int]", ("int", None)), ("float | None", ("float", None)),
    ("Union[str, None]", ("str", None)), ("Literal['x', 'y']", ("str", ("x", "y"))),
    ("torch.dtype", ("dtype", ("float32", "bfloat16", "float16"))), ("list[int]", None), ("Callable", None),
    ("int | str", None), ("Union[float, List[float]]", ("float", None)), ("list[int] | int", ("int", None)),
    ("Optional[Union[float, List[float]]]", ("float", None)), ("Union[float, List[int]]", None),
])
def test_scalar_annotations_become_option_types(annotation, expected):
    assert scalar_kind(ast.parse(annotation, mode="eval").body) == expected


def test_options_parse_typed_values_and_report_only_what_was_given():
    fields = [NativeField("fast", ("C",), "bool", None, "False", "Go fast.", "fw-"),
              NativeField("steps", ("C",), "int", None, "1", "", "fw-"),
              NativeField("mode", ("C",), "str", ("a", "b"), "'a'", "", "fw-"),
              NativeField("spec", ("C",), "text", None, "None", "", "fw-")]
    parser = OptionParser()
    add_options(parser.getgroup("fw native"), fields)
    option = parser.parse(["--fw-fast", "--fw-steps", "4", "--fw-spec", "a=1 b=2"])
    assert given_values(option, fields) == {"fast": True, "steps": 4, "spec": "a=1 b=2"}
    assert parser.parse(["--fw-fast", "off"]).fw_fast is False
    with pytest.raises(UsageError, match="--fw-mode: invalid choice"):
        parser.parse(["--fw-mode", "c"])
    assert "C.fast (default False). Go fast." in parser.format_help()


def test_a_native_switch_has_a_no_form_in_flags_and_files(tmp_path):
    from plasmid.app import configfile

    fields = [NativeField("fast", ("C",), "bool", None, "False", "Go fast.", "fw-")]
    parser = OptionParser(files=configfile)
    add_options(parser.getgroup("fw native"), fields)
    assert parser.parse(["--no-fw-fast"]).fw_fast is False
    assert parser.parse(["--fw-fast", "--no-fw-fast"]).fw_fast is False
    assert parser.parse(["--no-fw-fast", "--fw-fast"]).fw_fast is True
    assert parser.parse([]).fw_fast is None and parser.given(["--no-fw-fast"]) == {"fw_fast"}
    with pytest.raises(UsageError, match="--no-fw-fast: takes no value"):
        parser.parse(["--no-fw-fast", "true"])
    with pytest.raises(UsageError, match="invalid bool value: 'maybe'"):
        parser.parse(["--fw-fast", "maybe"])
    path = tmp_path / "run.json"
    for value in (False, True):   # a file's false undone by the flag, and the other way round
        path.write_text(f'{{"fw_fast": {str(value).lower()}}}')
        assert parser.parse(["--config", str(path)]).fw_fast is value
        flag = "--fw-fast" if not value else "--no-fw-fast"
        assert parser.parse(["--config", str(path), flag]).fw_fast is (not value)
    assert "--fw-fast [BOOL], --no-fw-fast" in parser.format_help()


def test_booleans_are_read_in_the_usual_spellings():
    assert [parse_bool(v) for v in ("1", "TRUE", "yes", "on", "0", "False", "no", "off")] == [True] * 4 + [False] * 4
    with pytest.raises(ValueError, match="expected true or false"):
        parse_bool("maybe")
