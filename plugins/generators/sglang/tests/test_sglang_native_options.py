"""``--sglang-<field>``: every ServerArgs field of the installed SGLang, read from its source without
importing it, typed, and handed to SGLang's own parser inside the server process."""

from __future__ import annotations

import ast
import subprocess
import sys

import plasmid_sglang.plugin
import pytest
from plasmid_sglang import native
from plasmid_sglang.server import CPU_MAX_TOTAL_TOKENS, server_fields
from sglang_test_support import sglang_installed

from plasmid import testing
from plasmid.config import OptionParser
from plasmid.errors import UsageError

needs_sglang = pytest.mark.skipif(not sglang_installed(), reason="SGLang is not installed")


@needs_sglang
def test_generated_fields_are_exactly_the_fields_of_the_imported_server_args():
    import msgspec
    from sglang.srt.server_args import ServerArgs

    imported = {f.name for f in msgspec.structs.fields(ServerArgs) if not f.name.startswith("_")}
    generated = {field.name for field in native.native_fields()}
    assert generated == imported - set(native.NOT_NATIVE)
    assert len(generated) > 300


def test_a_fake_source_tree_shows_how_annotations_become_options(tmp_path):
    (tmp_path / "srt" / "arg_groups" / "fields").mkdir(parents=True)
    (tmp_path / "srt" / "server_args.py").write_text(
        "from sglang.srt.arg_groups.fields.one import One\n"
        "from sglang.srt.arg_groups.fields.two import (\n    Two,\n)\n"
        "_INPUT_NAMESPACES = [\n    One,\n    Two,\n]\n")
    (tmp_path / "srt" / "arg_groups" / "fields" / "one.py").write_text(
        "from typing import Literal, List, Optional\nclass One(Struct):\n    _NS_PATH = 'one'\n"
        "    model_path: A[str, 'The model.']\n"
        "    sizes: A[Optional[List[int]], 'Sizes. More.'] = None\n"
        "    mode: A[Literal['x', 'y'], Arg(help='A mode. More text.')] = 'x'\n"
        "    fast: A[bool, 'Go fast.'] = False\n"
        "    budget: A[Optional[int], Arg(help='Tokens.', type_parser=human_int)] = None\n"
        "    _hidden: A[bool, Arg(no_cli=True)] = False\n")
    (tmp_path / "srt" / "arg_groups" / "fields" / "two.py").write_text(
        "class Two(Struct):\n    ratio: A[float, 'A ratio.'] = 0.5\n")
    fields = {field.name: field for field in native.native_fields(tmp_path)}
    assert list(fields) == ["sizes", "mode", "fast", "budget", "ratio"], "model_path is --model; _hidden is private"
    assert (fields["mode"].kind, fields["mode"].choices, fields["mode"].doc) == ("str", ("x", "y"), "A mode.")
    assert fields["sizes"].kind == "text" and fields["budget"].kind == "text", "parsed by SGLang itself"
    assert fields["fast"].kind == "bool" and fields["ratio"].kind == "float" and fields["ratio"].owners == ("Two",)
    assert fields["fast"].flag == "--sglang-fast" and fields["fast"].dest == "sglang_fast"


def heavy_modules_after(command: list[str]) -> tuple[str, list[str]]:
    probe = ("import contextlib, io, sys\nfrom plasmid.app.cli import main\n"
             f"with contextlib.redirect_stdout(io.StringIO()) as out: main({command!r})\n"
             "sys.stderr.write(out.getvalue())\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'sglang', 'transformers', 'aiohttp'}))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return result.stderr, ast.literal_eval(result.stdout.strip().splitlines()[-1])


def test_listing_and_showing_the_plugin_imports_neither_torch_nor_sglang():
    listed, heavy = heavy_modules_after(["plugins"])
    assert "sglang" in listed and heavy == []
    shown, heavy = heavy_modules_after(["plugins", "show", "sglang"])
    assert "--sglang-external-addrs" in shown and heavy == []
    if sglang_installed():
        assert "--sglang-mem-fraction-static" in shown and "--sglang-enable-deterministic-inference" in shown


@needs_sglang
def test_command_line_forms_of_booleans_numbers_and_text():
    parser = OptionParser()
    plasmid_sglang.plugin.plasmid_addoption(parser)
    option = parser.parse(["--sglang-dtype", "float32", "--sglang-sleep-on-idle", "--sglang-disable-radix-cache",
                           "false", "--sglang-tp-size", "2", "--sglang-max-total-tokens", "4k"])
    assert option.sglang_dtype == "float32" and option.sglang_tp_size == 2
    assert option.sglang_sleep_on_idle is True and option.sglang_disable_radix_cache is False
    assert option.sglang_max_total_tokens == "4k", "SGLang parses its own sizes"
    assert option.sglang_mem_fraction_static is None, "not given: SGLang's default"


@needs_sglang
def test_plasmid_fills_what_was_not_given_and_keeps_what_was(tmp_path):
    from plasmid_torch.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "m")
    config = testing.make_config(plasmid_sglang.plugin, configure=False, seed=7, sglang_dtype="bfloat16",
                                 sglang_max_total_tokens="2k", sglang_port=31000)
    values, texts = server_fields(config, str(model), ordinal=2, device="cpu")
    assert values["model_path"] == str(model) and values["host"] == "127.0.0.1" and values["random_seed"] == 9
    assert values["dtype"] == "bfloat16", "given wins over the checkpoint's float32"
    assert values["skip_tokenizer_init"] is True and values["weight_version"] == "0"
    assert values["attention_backend"] == "torch_native" and values["sleep_on_idle"] is True
    assert texts == {"max_total_tokens": "2k"} and "max_total_tokens" not in values
    assert "port" not in values, "the port is chosen at each start"
    fresh, _ = server_fields(testing.make_config(plasmid_sglang.plugin, configure=False), str(model), 0, "cpu")
    assert fresh["dtype"] == "float32", "the checkpoint's dtype, not SGLang's float16 for float32 checkpoints"
    assert fresh["max_total_tokens"] == CPU_MAX_TOTAL_TOKENS


@needs_sglang
def test_the_launcher_builds_server_args_with_typed_values_and_sglangs_own_parsing(tmp_path):
    from plasmid_sglang.launch import server_args_from_spec

    args = server_args_from_spec({"values": {"model_path": str(tmp_path), "port": 31234, "sleep_on_idle": True,
                                             "dllm_fdfo": False},
                                  "texts": {"max_total_tokens": "4k", "lora_paths": "a=/x b=/y"}})
    assert args.model_path == str(tmp_path) and args.port == 31234 and args.sleep_on_idle is True
    assert args.dllm_fdfo is False, "a default-true flag turned off, which SGLang's command line cannot do"
    assert args.max_total_tokens == 4000, "SGLang's human-readable sizes: 4k is 4000"
    assert args.lora_paths == ["a=/x", "b=/y"], "text split into words for SGLang's nargs='+' option"


def test_option_values_are_checked():
    with pytest.raises(UsageError, match=r"^--sglang-servers 0: must be >= 1$"):
        testing.make_config(plasmid_sglang.plugin, sglang_servers=0)
    with pytest.raises(UsageError, match=r"^--sglang-server-env 'NOEQUALS': expected KEY=VALUE$"):
        testing.make_config(plasmid_sglang.plugin, sglang_server_env=["NOEQUALS"])
    with pytest.raises(UsageError, match="use --engines 1 with it"):
        testing.make_config(plasmid_sglang.plugin, engine="sglang", engines=2, sglang_external_addrs="127.0.0.1:1")
