"""What plasmid_serving declares for every engine plugin: the shared ``--<prefix>-*`` settings,
``require_model``, the hooks' helpers, and native options built from source fields."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest
from serving_fakes import NAMES, FakeOptions, fake_options

from plasmid.config import OptionParser
from plasmid.errors import UsageError
from plasmid.options import Options, option, option_fields
from plasmid_serving.engine import require_model
from plasmid_serving.hooks import add_engine_options, check_external_addrs
from plasmid_serving.native_options import SourceField, native_fields_of
from plasmid_serving.options import SETTINGS, ServingOptions


def test_the_shared_settings_are_declared_with_the_prefix_before_the_class_own_fields():
    class Mine(ServingOptions, Options, group="mine"):
        prefix = "mine"
        serving_help = {"external_addrs": "attach to mine", "max_restarts": "restarts of {prefix} servers"}
        mine_own: int = option(1, "its own")

    fields = {field.flag: field for field in option_fields(Mine)}
    assert list(fields) == [f"--mine-{setting.name.replace('_', '-')}" for setting in SETTINGS] + ["--mine-own"]
    assert fields["--mine-external-addrs"].spec.help == "attach to mine"
    assert fields["--mine-max-restarts"].spec.help == "restarts of mine servers"
    assert fields["--mine-log-dir"].help_text() == "server logs (default: <run dir>/mine)"
    options = Mine.defaults()
    assert (options.setting("request_retries"), options.setting("startup_timeout")) == (3, 900.0)
    with pytest.raises(UsageError, match="--mine-max-concurrency 0: must be >= 1"):
        Mine.from_values({"mine_max_concurrency": 0})
    with pytest.raises(TypeError, match="serving_help needs the help of 'external_addrs'"):
        class Unhelped(ServingOptions, Options, group="unhelped"):
            prefix = "unhelped"


def test_a_server_env_entry_needs_key_and_value():
    assert fake_options(server_env=["A=1", "B=x=y"]).server_env == {"A": "1", "B": "x=y"}
    with pytest.raises(UsageError, match="--fake-server-env 'NOEQUALS': expected KEY=VALUE"):
        fake_options(server_env=["NOEQUALS"])


def config(**values):
    option = SimpleNamespace(**values)
    return SimpleNamespace(option=option, run_dir="/runs/1")


def test_require_model_names_the_engine_its_plugin_and_framework():
    assert require_model(config(model="/models/m"), NAMES) == "/models/m"
    with pytest.raises(UsageError, match=r"^engine 'fake' \(plugin plasmid-fake\) needs --model DIR: a local Hugging "
                                         r"Face model directory that Fake can serve$"):
        require_model(config(model=None), NAMES)


def test_attached_servers_go_to_one_engine():
    check_external_addrs(config(engine="fake", engines=2, fake_external_addrs=None), FakeOptions)
    check_external_addrs(config(engine="other", engines=2, fake_external_addrs="h:1"), FakeOptions)
    check_external_addrs(config(engine="fake", engines=1, fake_external_addrs="h:1"), FakeOptions)
    with pytest.raises(UsageError, match=r"^--fake-external-addrs gives every server to one engine, which balances "
                                         r"requests over them; use --engines 1 with it \(plugin fake\)$"):
        check_external_addrs(config(engine="fake", engines=2, fake_external_addrs="h:1"), FakeOptions)


def test_native_fields_of_keeps_the_first_owner_of_a_name_and_leaves_out_skipped_ones():
    def field(name, annotation, default, doc=""):
        return SourceField(name, "?", ast.parse(annotation, mode="eval").body, default, doc)

    sources = [("A", field("size", "int", "3", "How big.")), ("A", field("model", "str", None)),
               ("B", field("size", "float", "1.0")), ("B", field("paths", "list[str]", None, "Paths."))]
    fields = native_fields_of(sources, "fw-", skip={"model"})
    assert [(f.name, f.owners, f.kind, f.default, f.doc) for f in fields] == [
        ("size", ("A",), "int", "3", "How big."), ("paths", ("B",), "text", "required", "Paths.")]
    custom = native_fields_of(sources[:1], "fw-", option_type=lambda source: ("str", ("a", "b"), "custom"))
    assert (custom[0].kind, custom[0].choices, custom[0].doc, custom[0].flag) == ("str", ("a", "b"), "custom",
                                                                                  "--fw-size")


def test_add_engine_options_declares_the_classes_then_the_native_group():
    parser = OptionParser()
    fields = native_fields_of([("A", SourceField("size", "A", ast.parse("int", mode="eval").body, "3", ""))], "fake-")
    add_engine_options(parser, (FakeOptions,), prefix="fake", label="Fake", native="Fake settings", fields=fields,
                       plasmid_defaults={"size": "4 on cpu"})
    text = " ".join(parser.format_help().split())
    assert FakeOptions in parser.option_classes and "--fake-max-restarts" in text and "--fake-size" in text
    assert "Fake settings, generated from the installed version; unset means Fake's default, or plasmid's for: " \
           "size (4 on cpu)" in text
