"""benchmarks/soak.py's fault kinds at a toy size: its argument checks, a gateway flood against a real
gateway-shaped refusal, and one short soak over the remote, agent and async modes with hostile math
and code answers, trickled remote answers and gateway floods, each tallied and survived, no sample lost.
(The Ray faults, engine/trainer kills, are the Ray runtime's own tests: plugins/runtimes/ray/tests.)"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_soak", BENCHMARKS / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_unknown_modes_and_faults_are_refused_in_one_line(soak: ModuleType, capsys: pytest.CaptureFixture[str]):
    for flags, words in ((["--modes", "local,gpu"], "--modes local,gpu: unknown gpu"),
                         (["--faults", "sigkill,meteor"], "--faults sigkill,meteor: unknown meteor")):
        with pytest.raises(SystemExit) as exit_info:
            soak.parse_args(flags)
        assert exit_info.value.code == 2
        assert words in capsys.readouterr().err
    args = soak.parse_args(["--modes", "ray, agent", "--faults", "trainer-kill"])
    assert (args.modes, args.faults) == (["ray", "agent"], ["trainer-kill"])


def test_the_scoring_server_trickles_what_it_is_told_to(soak: ModuleType):
    import time
    import urllib.request

    body = json.dumps({"response": " 12 ", "label": "12"}).encode()
    plain = soak.ScoringServer(0.0, seed=0)
    with urllib.request.urlopen(urllib.request.Request(plain.url, data=body), timeout=10) as reply:
        assert json.loads(reply.read()) == {"reward": 1.0}
    assert plain.trickled_since(0) == []
    slow = soak.ScoringServer(1.0, seed=0)
    began = time.monotonic()
    with urllib.request.urlopen(urllib.request.Request(slow.url, data=body), timeout=30) as reply:
        assert json.loads(reply.read()) == {"reward": 1.0}
    assert time.monotonic() - began >= soak.TRICKLE_SECONDS * (len(b'{"reward": 1.0}') - 1)
    assert len(slow.trickled_since(0)) == 1


@pytest.mark.timeout(300)
def test_a_short_soak_survives_each_new_fault_kind(tmp_path: Path):
    work = tmp_path / "soak"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "soak.py"), "--modes", "async,remote,agent", "--runs", "3",
         "--minutes", "4", "--steps", "4", "--save-interval", "1", "--eval-interval", "0", "--prompts", "4",
         "--samples", "4", "--faults", "gateway-flood", "--fault-min", "1", "--fault-max", "1.5", "--raise-p", "0",
         "--hang-p", "0", "--hostile-p", "0.3", "--trickle-p", "0.15", "--flood-requests", "30", "--reward-timeout",
         "5", "--work-dir", str(work)], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    kinds = summary["kinds"]
    assert summary["samples_lost"] == 0 and summary["failures"] == 0, summary
    assert summary["steps"] == 12, summary
    for kind in ("remote-trickle", "gateway-flood"):
        assert kinds.get(kind, {}).get("survived", 0) >= 1, (kind, kinds)
    # hostile answers (math and code in turn, one at a time) are drawn at random: at least one graded
    assert sum(kinds.get(kind, {}).get("survived", 0) for kind in ("hostile-math", "hostile-code")) >= 1, kinds
    for kind, counts in kinds.items():
        assert counts["survived"] + counts["superseded"] == counts["injected"], (kind, counts)
    assert "gateway-flood" in proc.stdout and "injected" in proc.stdout
