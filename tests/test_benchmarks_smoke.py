"""Cheap checks of benchmarks/run.py, bench_vs_trl.py and bench_torchgen.py: argument checks, the
summary arithmetic on a made-up curve, skip/fail reporting, bench_torchgen's plumbing at a toy size.
No timing is asserted here (benchmarks measure; tests assert)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vs_trl() -> ModuleType:
    return load("bench_vs_trl")


@pytest.fixture(scope="module")
def runner() -> ModuleType:
    return load("run")


def test_vs_trl_needs_a_trl_python_unless_trl_is_left_out(vs_trl: ModuleType, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        vs_trl.parse_args(["--systems", "plasmid", "trl", "--trl-python", "/nonexistent/python"])
    assert exit_info.value.code == 2
    assert "--trl-python /nonexistent/python: no such file" in capsys.readouterr().err
    args = vs_trl.parse_args(["--systems", "plasmid", "raw", "--trl-python", "/nonexistent/python"])
    assert args.systems == ["plasmid", "raw"]
    with pytest.raises(SystemExit):
        vs_trl.parse_args(["--systems", "raw", "--steady", "30", "10"])


def test_vs_trl_worker_seed_is_not_taken_for_seeds(vs_trl: ModuleType):
    """``--seed`` (a worker's) must not be read as an abbreviation of ``--seeds``."""
    args = vs_trl.parse_args(["--worker", "raw", "--seed", "3", "--scratch", "/tmp/x"])
    assert args.seed == 3 and args.seeds == [0, 1, 2]


def curve(times: dict[int, float], evals: dict[int, float], last: int) -> list[dict]:
    return [{"step": step, "reward": 0.5, "tokens": 256, **({"t": times[step]} if step in times else {}),
             **({"eval_accuracy": evals[step]} if step in evals else {})} for step in range(1, last + 1)]


def test_summary_of_a_curve(vs_trl: ModuleType):
    # arrival every 10th step and on eval steps (like plasmid's progress lines): 2 s start-up, 50 ms/step
    times = {step: 2.0 + 0.05 * step for step in range(1, 401) if step % 10 in (0, 1)}
    evals = {step: (0.95 if step >= 370 else 0.5) for step in range(10, 401, 10)}
    task = {"target": 0.9, "steady": [100, 300]}
    summary = vs_trl.summarize(curve(times, evals, 370), task, None)
    assert summary["reached_bar"] and summary["steps_to_bar"] == 370
    assert summary["samples_to_bar"] == 370 * 256
    assert summary["seconds_to_bar"] == pytest.approx(2.0 + 0.05 * 370)
    assert summary["steady_window"] == [100, 300]
    assert summary["steady_ms_per_step"] == pytest.approx(50.0)
    assert summary["steady_samples_per_s"] == pytest.approx(256 / 0.05)
    assert summary["steady_tokens_per_s"] == pytest.approx(256 / 0.05)
    assert summary["first_step_seconds"] == pytest.approx(2.05)


def test_summary_of_a_run_that_stops_before_the_window_ends(vs_trl: ModuleType):
    times = {step: 0.1 * step for step in range(1, 51)}
    summary = vs_trl.summarize(curve(times, {50: 0.2}, 50), {"target": 0.9, "steady": [100, 300]}, None)
    assert not summary["reached_bar"] and summary["seconds_to_bar"] is None
    assert summary["steady_window"] == [10, 50]  # K = a fifth of the last step
    assert summary["steady_ms_per_step"] == pytest.approx(100.0)
    no_bar = vs_trl.summarize(curve(times, {}, 50), {"target": None, "steady": [10, 50]}, None)
    assert no_bar["reached_bar"] is False and no_bar["last_eval_accuracy"] is None


def test_ratios_of_medians(vs_trl: ModuleType):
    def run(system: str, seconds: float, ms: float) -> dict:
        return {"system": system, "reached_bar": True, "seconds_to_bar": seconds, "steps_to_bar": 100,
                "samples_to_bar": 25600, "first_step_seconds": 1.0, "steady_ms_per_step": ms,
                "steady_samples_per_s": 1.0, "steady_tokens_per_s": 1.0}
    runs = [run("plasmid", s, 60.0) for s in (10.0, 12.0, 30.0)] + [run("raw", s, 30.0) for s in (6.0, 8.0, 9.0)]
    runs += [run("trl", s, 90.0) for s in (24.0, 24.0, 1.0)]
    table = vs_trl.summary_table(runs, ["plasmid", "trl", "raw"])
    assert table["ratios"]["plasmid/raw seconds_to_bar"] == pytest.approx(12.0 / 8.0)
    assert table["ratios"]["trl/plasmid seconds_to_bar"] == pytest.approx(24.0 / 12.0)
    assert table["ratios"]["trl/plasmid steady_ms_per_step"] == pytest.approx(1.5)
    assert table["medians"]["raw"]["reached_bar"] == "3/3"


def test_run_skips_absent_scripts_and_reports_failures(runner: ModuleType, tmp_path: Path, monkeypatch):
    (tmp_path / "fails.py").write_text("import sys\nprint('half')\nsys.exit('fails: the engine would not start')\n")
    (tmp_path / "works.py").write_text(
        "import argparse, json, pathlib\np = argparse.ArgumentParser()\np.add_argument('--json')\n"
        "a = p.parse_args()\npathlib.Path(a.json).write_text(json.dumps({'x': 1}))\nprint('x 1')\n")
    monkeypatch.setattr(runner, "HERE", tmp_path)
    args = runner.parse_args(["--out", str(tmp_path / "out")])
    args.out.mkdir()
    absent = runner.run_one(runner.Bench("absent", "absent.py", lambda a: []), args)
    assert absent["status"] == "skipped" and "does not exist" in absent["reason"]
    missing = runner.run_one(runner.Bench("needs", "works.py", lambda a: [], needs=lambda a: "no TRL here"), args)
    assert missing == {"name": "needs", "script": "benchmarks/works.py", "status": "skipped",
                       "reason": "no TRL here"}
    failed = runner.run_one(runner.Bench("fails", "fails.py", lambda a: []), args)
    assert failed["status"] == "failed"
    assert failed["reason"] == "exit status 1: fails: the engine would not start"
    works = runner.run_one(runner.Bench("works", "works.py", lambda a: [],
                                        optional=[("--json", "{out}/{name}.json"), ("--quick", "")],
                                        writes_json="{name}.json"), args)
    assert works["status"] == "ok" and works["json"] == {"x": 1}
    assert "--quick" not in works["command"]  # not in works.py's --help: not passed


def test_run_plans_vs_trl_with_three_seeds():
    plan = subprocess.run([sys.executable, str(BENCHMARKS / "run.py"), "--dry-run", "--only", "vs_trl"],
                          capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "bench_vs_trl.py --seeds 0 1 2" in plan.stdout


#: what benchmarks/run.py runs, each in an env without pytest (requirements/bench.txt has none)
RUN_SCRIPTS = ("run.py", "bench_torchgen.py", "bench_quickstart.py", "bench_vs_trl.py", "bench_weight_sync.py",
               "bench_scaling.py", "bench_engines.py", "bench_real_model.py", "bench_rewards.py",
               "bench_steady_step.py", "bench_vision_batching.py", "bench_ray_snapshot.py")


@pytest.mark.parametrize("script", RUN_SCRIPTS)
def test_scripts_answer_help_without_pytest(script):
    """``--help`` answers, with pytest made unimportable: a benchmark that reaches test support must take
    it from a module without pytest (plasmid_torch.testing.batches), or the bench env cannot run it."""
    code = ("import runpy, sys; sys.modules['pytest'] = None; sys.argv = [sys.argv[1], '--help']; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code, str(BENCHMARKS / script)], capture_output=True, text=True,
                          timeout=120, cwd=BENCHMARKS)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


def test_bench_torchgen_runs_rl_shaped_groups_at_a_toy_size():
    """``--group-size``: the engine gets every sample's request, ``generate`` the distinct prompts with
    ``num_return_sequences``; both answer the whole batch (the tokens/s figures count the tokens made)."""
    command = [sys.executable, str(BENCHMARKS / "bench_torchgen.py"), "--batch", "8", "--new-tokens", "3",
               "--group-size", "4", "--repeats", "1", "--decoders", "lean", "--device", "cpu"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=BENCHMARKS)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "batch 8 (2 prompts x 4 samples), 3 new tokens" in done.stdout
    assert "ratio lean:" in done.stdout and "mean batch size 8.0" not in done.stdout  # the prefill ran 2 rows
    refused = subprocess.run([*command[:2], "--batch", "8", "--group-size", "3"], capture_output=True, text=True,
                             timeout=120, cwd=BENCHMARKS)
    assert refused.returncode == 2 and "--group-size 3 must be >= 1 and divide --batch 8" in refused.stderr


@pytest.mark.parametrize(("flags", "message"), [
    (["--group-size", "1"], "--group-size must be >= 2"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--lr", "0"], "--lr must be > 0"),
])
def test_bench_real_model_refuses_bad_settings_in_one_line(flags, message, tmp_path):
    """Refused before any model is converted or any run starts: exit 2, one line, nothing written."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_real_model.py"), *flags, "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120, cwd=BENCHMARKS)
    assert done.returncode == 2 and message in done.stderr.splitlines()[-1], done.stderr
    assert not (tmp_path / "out").exists()


def test_bench_real_model_measures_a_process_peak_and_its_children(tmp_path):
    """``measured``: the lines a process prints with their arrival times, the peak RSS of it or of its largest
    descendant (wait4) and the polled peak of it and its children together; a child holding 200 MB raises both."""
    bench = load("bench_real_model")
    code = ("import subprocess, sys, time; print('hello', flush=True); "
            "subprocess.run([sys.executable, '-c', 'b = bytearray(200 << 20); import time; time.sleep(1.5)'])")
    lines, own, tree = bench.measured([sys.executable, "-c", code], dict(os.environ), "toy")
    assert [line for _, line in lines] == ["hello"]
    assert own > 0.2 and tree > 0.2, (own, tree)
    with pytest.raises(bench.BenchError, match="toy exited with status 3"):
        bench.measured([sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ), "toy")


def test_bench_rewards_compares_the_math_grader_with_its_baseline_from_git():
    """One round over the math reward's labelled set, this tree against the graders before the
    hardening (exported from git): both score every case and the baseline really is the old source."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_rewards.py"), "--rounds", "1", "--rewards", "math"],
                          capture_output=True, text=True, timeout=300, cwd=BENCHMARKS)
    if done.returncode == 2 and "is not a commit of this clone" in done.stderr:
        pytest.skip("the baseline commit is not in this (shallow) clone")
    assert done.returncode == 0, done.stderr[-2000:]
    header, row = done.stdout.strip().splitlines()[-2:]
    assert header.split()[:5] == ["reward", "samples", "this", "/s", "baseline"]
    name, samples, now, before, ratio = row.split()[:5]
    assert name == "math" and int(samples) >= 100 and float(now) > 0 and float(before) > 0
    assert float(ratio) == pytest.approx(float(now) / float(before), rel=0.02)


def test_bench_steady_step_runs_this_tree_against_an_exported_revision():
    """A toy run (12 steps, seed 0) of this tree against its own HEAD exported from git: both runs log
    step times, and the printed ratio is theirs; an unknown revision is one line, exit 2."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_steady_step.py"), "--before", "HEAD", "--seeds", "0",
                           "--steps", "12", "--warmup", "2"], capture_output=True, text=True, timeout=300,
                          cwd=BENCHMARKS)
    if done.returncode == 2 and "is not a commit of this clone" in done.stderr:
        pytest.skip("HEAD is not a commit here")
    assert done.returncode == 0, done.stderr[-2000:]
    seed_line, summary = done.stdout.strip().splitlines()[-2:]
    before, now = (float(part.split()[0]) for part in seed_line.split(") ")[1].split("now "))
    assert before > 0 and now > 0
    assert float(summary.rsplit(" ", 1)[1]) == pytest.approx(now / before, abs=0.011), summary  # printed rounded
    bad = subprocess.run([sys.executable, str(BENCHMARKS / "bench_steady_step.py"), "--before", "no-such-rev"],
                         capture_output=True, text=True, timeout=60, cwd=BENCHMARKS)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "bench_steady_step: --before no-such-rev is not a commit of this clone"], bad.stderr
