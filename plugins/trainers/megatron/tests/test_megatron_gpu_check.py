"""benchmarks/gpu_check_megatron.py's CPU path (``--device cpu --tiny``): the Megatron device
check's loop (the megatron trainer with the local layer spec trains, then exports its weights) runs
end to end and writes its figures; its arguments and its carried-wheel import refuse bad input.
The GPU run is the same code on --device cuda."""

from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[4] / "benchmarks" / "gpu_check_megatron.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check_megatron", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(600)
def test_the_megatron_device_check_runs_on_the_cpu_and_writes_its_figures(tmp_path):
    out = tmp_path / "check.json"
    assert load_script().main(["--device", "cpu", "--tiny", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["transformer_impl"] == "local"
    assert report["tensor_model_parallel_size"] == 1 and report["megatron_core"] != "unknown"
    run = report["runs"]["tiny"]
    assert run["bad_steps"] == [] and run["losses_finite"] and len(run["steps"]) == 2
    assert run["trainer_tokens_per_second"] > 0 and run["non_embedding_parameters"] > 0
    assert run["export_buckets"] == 1 and run["export_bytes"] > 0 and "mfu" not in run


def test_bad_arguments_and_a_bad_wheel_are_refused(tmp_path, capsys):
    module = load_script()
    with pytest.raises(SystemExit):
        module.parse(["--samples", "1"])
    assert "--samples >= 2" in capsys.readouterr().err
    not_a_wheel = tmp_path / "megatron.whl"
    not_a_wheel.write_text("nope")
    with pytest.raises(SystemExit, match="not a wheel file"):
        module.use_wheel(not_a_wheel, tmp_path / "unpacked")
    other = tmp_path / "other.whl"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("other/__init__.py", "")
    with pytest.raises(SystemExit, match="holds no megatron/core/"):
        module.use_wheel(other, tmp_path / "unpacked")
