"""benchmarks/gpu_check.py's CPU path (``--device cpu --tiny``): the device check's loop (torchgen
samples, torchtrain trains in bf16 with LoRA off and on, weights synced back, then torchgen is timed
against ``generate``) runs end to end and writes its figures; the GPU run is the same code on --device
cuda."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("peft")
pytest.importorskip("plasmid_torchgen")
SCRIPT = Path(__file__).resolve().parents[4] / "benchmarks" / "gpu_check.py"


@pytest.mark.timeout(600)
def test_the_device_check_runs_on_the_cpu_and_writes_its_figures(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "check.json"
    assert module.main(["--device", "cpu", "--tiny", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["precision"] == "bf16"
    assert sorted(report["runs"]) == ["tiny/full", "tiny/lora"]
    for run in report["runs"].values():
        assert run["bad_steps"] == [] and len(run["steps"]) == 2
        assert run["gen_tokens_per_second"] > 0 and run["trainer_tokens_per_second"] > 0
        # bf16 rounding, synced weights (exactly 0 where the full-sequence and the decoding passes
        # round alike: transformers 5.24 on this CPU); reported on every step
        assert run["train_rollout_logprob_abs_diff"] is not None
        assert 0 <= run["train_rollout_logprob_abs_diff"] <= 5e-3
        assert run["sync_seconds"] >= 0 and "mfu" not in run
    parity = report["parity"]           # plasmid parity, torchgen against torchtrain, bf16's default bound
    assert parity["status"] == 0 and 0 <= parity["max"] <= 5e-2, parity
    (shape, figures), = report["torchgen_vs_generate"].items()      # engine vs generate, at a toy size
    assert shape == "tiny x1 fp32" and figures["batch"] == 16 and figures["generate_tokens_per_second"] > 0
    assert figures["lean"] > 0 and figures["hf"] > 0
