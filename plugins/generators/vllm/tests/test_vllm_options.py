"""plasmid's own vllm options (VLLMOptions) and the generated --vllm-<engine argument> options:
typed, a bad value fails at configuration time in one line naming the flag, unset options read
their defaults, and the server's command line is built from them. No server needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import plasmid_vllm.plugin
import pytest
from plasmid_vllm import native
from plasmid_vllm.options import VLLMOptions
from plasmid_vllm.server import CPU_MAX_MODEL_LEN, WORKER_EXTENSION, server_argv, server_values
from vllm_test_support import vllm_installed

from plasmid import testing
from plasmid.errors import UsageError

needs_vllm = pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed")


@pytest.mark.parametrize(("name", "value", "message"), [
    ("vllm_max_concurrency", 0, "--vllm-max-concurrency 0: must be >= 1"),
    ("vllm_startup_timeout", 0.0, "--vllm-startup-timeout 0.0: must be > 0"),
    ("vllm_request_retries", -1, "--vllm-request-retries -1: must be >= 0"),
    ("vllm_health_interval", -1.0, "--vllm-health-interval -1.0: must be >= 0"),
    ("vllm_max_restarts", -2, "--vllm-max-restarts -2: must be >= 0"),
    ("vllm_server_env", ["NOEQUALS"], "--vllm-server-env 'NOEQUALS': expected KEY=VALUE"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_the_flag(name, value, message):
    with pytest.raises(UsageError) as failure:
        testing.make_config(plasmid_vllm.plugin, **{name: value})
    assert str(failure.value) == message


def test_typed_reads_give_the_declared_defaults():
    config = testing.make_config(plasmid_vllm.plugin, run_dir="runs/x")
    options = VLLMOptions.of(config)
    assert options == VLLMOptions.defaults()
    assert options.external_addresses == [] and options.server_env == {}
    assert options.log_dir(config.run_dir) == Path("runs/x/vllm")


def test_external_addresses_need_one_engine():
    with pytest.raises(UsageError, match="use --engines 1"):
        testing.make_config(plasmid_vllm.plugin, engine="vllm", vllm_external_addrs="127.0.0.1:1,127.0.0.1:2",
                            engines=2)
    options = VLLMOptions.of(testing.make_config(plasmid_vllm.plugin, vllm_external_addrs=" a:1, b:2 "))
    assert options.external_addresses == ["a:1", "b:2"]


def test_a_fake_source_tree_shows_how_fields_become_options(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "arg_utils.py").write_text(
        "from typing import Literal\n"
        "@dataclass\nclass EngineArgs:\n"
        "    model: str = ModelConfig.model\n"
        "    max_num_seqs: int | None = None\n"
        "    dtype: ModelDType = ModelConfig.dtype\n"
        "    enforce_eager: bool = False\n"
        "    mode: Literal['a', 'b'] = 'a'\n"
        "    sizes: list[int] | None = None\n"
        "    _private: int = 0\n"
        "@dataclass\nclass AsyncEngineArgs(EngineArgs):\n"
        "    enable_log_requests: bool = False\n")
    fields = {field.name: field for field in native.native_fields(tmp_path)}
    assert list(fields) == ["max_num_seqs", "dtype", "enforce_eager", "mode", "sizes", "enable_log_requests"]
    assert fields["max_num_seqs"].kind == "int" and fields["enforce_eager"].kind == "bool"
    assert fields["dtype"].kind == "text" and fields["sizes"].kind == "text", "parsed by vLLM's own parser"
    assert fields["mode"].choices == ("a", "b") and fields["mode"].flag == "--vllm-mode"


@needs_vllm
def test_generated_fields_are_exactly_the_fields_of_the_installed_engine_args():
    code = ("import dataclasses, json\nfrom vllm.engine.arg_utils import AsyncEngineArgs\n"
            "print(json.dumps([f.name for f in dataclasses.fields(AsyncEngineArgs)]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {name for name in __import__("json").loads(proc.stdout.splitlines()[-1]) if not name.startswith("_")}
    generated = {field.name for field in native.native_fields()}
    assert generated == imported - set(native.NOT_NATIVE)
    assert len(generated) > 150


@needs_vllm
def test_given_options_reach_the_server_command_line_with_plasmids_defaults_for_the_rest(tmp_path):
    config = testing.make_config(plasmid_vllm.plugin, model=str(tmp_path), seed=5, vllm_max_num_seqs=8,
                                 vllm_enable_prefix_caching=False, vllm_dtype="float16",
                                 vllm_logprobs_mode="raw_logprobs")
    values = server_values(config, str(tmp_path), ordinal=2, device="cpu")
    assert values["seed"] == 7 and values["max_model_len"] == CPU_MAX_MODEL_LEN
    assert values["worker_extension_cls"] == WORKER_EXTENSION and values["skip_tokenizer_init"] is True
    assert values["logprobs_mode"] == "raw_logprobs", "a given option wins over plasmid's default"
    argv = server_argv(values)
    assert "--no-enable-prefix-caching" in argv and argv[argv.index("--max-num-seqs") + 1] == "8"
    assert argv[argv.index("--dtype") + 1] == "float16" and "--skip-tokenizer-init" in argv


@needs_vllm
def test_the_command_line_forms_parse_to_typed_values():
    from plasmid.config import OptionParser

    parser = OptionParser()
    plasmid_vllm.plugin.plasmid_addoption(parser)
    namespace = parser.parse(["--vllm-max-num-seqs", "8", "--vllm-enforce-eager", "--vllm-enable-prefix-caching",
                              "false", "--vllm-dtype", "float16", "--vllm-server-env", "A=1"])
    assert (namespace.vllm_max_num_seqs, namespace.vllm_enforce_eager, namespace.vllm_enable_prefix_caching,
            namespace.vllm_dtype) == (8, True, False, "float16")
    assert VLLMOptions.from_values(vars(namespace)).server_env == {"A": "1"}


def test_routed_experts_are_refused_at_start_up_since_vllm_does_not_report_them():
    with pytest.raises(UsageError, match=r"^--return-routed-experts: the vllm engine does not report") as failure:
        testing.make_config(plasmid_vllm.plugin, engine="vllm", return_routed_experts=True)
    assert "\n" not in str(failure.value)
    config = testing.make_config(plasmid_vllm.plugin, engine="torchgen", return_routed_experts=True)
    assert config.option.return_routed_experts, "another engine's run is left alone"
