"""An unknown ``--sglang-*``/``--vllm-*``/``--megatron-*`` option names the package to install (one line, exit 2),
instead of a "did you mean" pointing at an unrelated flag (issue 35)."""

from __future__ import annotations

import pytest

from plasmid.app import native_hint
from plasmid.app.cli import main


def test_a_missing_frameworks_flag_names_what_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(native_hint, "missing", lambda framework: ["plasmid-sglang", "sglang"]
                        if framework.prefix == "sglang" else [])
    assert main(["train", "--sglang-tp-size", "2", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean" not in err and not (tmp_path / "run").exists()
    assert err.startswith("plasmid: error: --sglang-tp-size is one of SGLang's native options")
    assert "pip install plasmid-sglang sglang" in err and "requirements/sglang.txt" in err
    assert main(["train", "--no-sglang-enable-torch-compile"]) == 2
    assert "--no-sglang-enable-torch-compile is one of SGLang's" in capsys.readouterr().err
    config = tmp_path / "run.toml"
    config.write_text("sglang_tp_size = 2\n")
    assert main(["train", "--config", str(config)]) == 2
    assert f"--config {config}: 'sglang_tp_size' is one of SGLang's native options" in capsys.readouterr().err


@pytest.mark.parametrize("message", [
    "unknown option --sglang-tp-size; did you mean '--global-batch-size'? ('plasmid train --help' lists the options)",
    "unknown option --vllm-x ('plasmid train --help' lists the options)",
    "--config a.yaml: unknown option 'megatron_tp'; did you mean 'x'?",
])
def test_only_a_missing_package_changes_the_message(message, monkeypatch):
    monkeypatch.setattr(native_hint, "missing", lambda framework: [])
    assert native_hint.install_hint(message) is None
    monkeypatch.setattr(native_hint, "missing", lambda framework: [framework.install])
    hint = native_hint.install_hint(message)
    assert hint is not None and "did you mean" not in hint and "pip install" in hint


@pytest.mark.parametrize("message", ["unknown option --lr-x", "unknown option --sglangx", "--lr: invalid float value"])
def test_other_errors_are_left_alone(message):
    assert native_hint.install_hint(message) is None


def test_installation_is_looked_up_without_importing():
    sglang = next(f for f in native_hint.FRAMEWORKS if f.prefix == "sglang")
    assert native_hint.missing(sglang) == [name for name in ("plasmid-sglang", "sglang")
                                           if not (native_hint.distribution_installed(name) if name.startswith(
                                               "plasmid") else native_hint.module_installed(name))]
    assert native_hint.module_installed("no_such_module_anywhere.sub") is False
