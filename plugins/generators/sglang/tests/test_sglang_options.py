"""plasmid's own sglang options are declared once, typed (SGLangOptions; the generated
--sglang-<ServerArgs field> options are tested in test_sglang_native_options): a bad value fails at
configuration time in one line naming the flag, and an unset option reads its declared default.
These tests need neither SGLang nor a server."""

from __future__ import annotations

from pathlib import Path

import plasmid_sglang.plugin
import pytest
from plasmid_sglang.options import SGLangOptions

from plasmid import testing
from plasmid.errors import UsageError
from plasmid_torch.disk_sync import DiskSyncOptions


@pytest.mark.parametrize(("name", "value", "message"), [
    ("sglang_max_concurrency", 0, "--sglang-max-concurrency 0: must be >= 1"),
    ("sglang_startup_timeout", 0.0, "--sglang-startup-timeout 0.0: must be > 0"),
    ("sglang_request_retries", -1, "--sglang-request-retries -1: must be >= 0"),
    ("sglang_health_interval", -1.0, "--sglang-health-interval -1.0: must be >= 0"),
    ("sglang_max_restarts", -2, "--sglang-max-restarts -2: must be >= 0"),
    ("sglang_update_timeout", 0.0, "--sglang-update-timeout 0.0: must be > 0"),
    ("sglang_tensor_transport", "shm", "--sglang-tensor-transport 'shm': choose one of auto, pickle, cuda-ipc"),
    ("sglang_router_policy", "fastest",
     "--sglang-router-policy 'fastest': choose one of cache_aware, round_robin, random, power_of_two"),
    ("sync_keep_versions", 0, "--sync-keep-versions 0: must be >= 1"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_the_flag(name, value, message):
    with pytest.raises(UsageError) as failure:
        testing.make_config(plasmid_sglang.plugin, **{name: value})
    assert str(failure.value) == message


def test_typed_reads_give_the_declared_defaults():
    config = testing.make_config(plasmid_sglang.plugin, run_dir="runs/x")
    options = SGLangOptions.of(config)
    assert options == SGLangOptions.defaults()
    assert (options.sglang_servers, options.sglang_max_concurrency, options.sglang_health_interval,
            options.sglang_max_restarts, options.sglang_request_retries) == (1, 512, 10.0, 3, 3)
    assert options.external_addresses == [] and options.server_env == {} and options.sglang_router_arg == ()
    assert options.log_dir(config.run_dir) == Path("runs/x/sglang")
    assert DiskSyncOptions.of(config).sync_keep_versions == 2, "sglang-disk's options are declared here too"


def test_repeatable_and_listed_options_read_typed():
    options = SGLangOptions.of(testing.make_config(
        plasmid_sglang.plugin, sglang_external_addrs="10.0.0.1:30000, 10.0.0.2:30000",
        sglang_server_env=["A=1", "B=x=y"], sglang_router_arg=["--queue-size=256"]))
    assert options.external_addresses == ["10.0.0.1:30000", "10.0.0.2:30000"]
    assert options.server_env == {"A": "1", "B": "x=y"} and options.sglang_router_arg == ("--queue-size=256",)


def test_the_command_line_forms_parse_to_the_same_typed_values():
    from plasmid.config import OptionParser

    parser = OptionParser()
    plasmid_sglang.plugin.plasmid_addoption(parser)
    namespace = parser.parse(["--sglang-server-env", "A=1", "--sglang-server-env", "B=2", "--sglang-router",
                              "--sglang-router-arg=--queue-size=256", "--sglang-health-interval", "0"])
    options = SGLangOptions.from_values(vars(namespace))
    assert options.server_env == {"A": "1", "B": "2"} and options.sglang_router is True
    assert options.sglang_router_arg == ("--queue-size=256",) and options.sglang_health_interval == 0.0


def test_sglang_disk_reads_the_shared_disk_options_without_plasmid_sync(tmp_path):
    config = testing.make_config(plasmid_sglang.plugin, run_dir=tmp_path / "run", sync_keep_versions=3)
    sync = testing.build("weight_sync", "sglang-disk", plasmid_sglang.plugin, config=config)
    assert sync.keep == 3 and sync.root == tmp_path / "run" / "weights"
