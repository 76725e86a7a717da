"""Throughput of the rollout engines (torchgen, SGLang, vLLM) on the same tiny model and the same requests.

Builds one tiny Qwen2 (``plasmid_torch.tiny.build_tiny_model``, the quickstart's vocabulary and
size, with one attention head of 64: vLLM's CPU attention has no kernel for the quickstart's head
size 16) and starts one worker process per engine, each in the interpreter that has that engine
(``--torchgen-python``, ``--sglang-python``, ``--vllm-python``; an interpreter without the engine's
plugin and package is skipped with one line). Each worker builds its engine (``sglang`` and
``vllm`` launch one server) and answers timing requests on its stdin. For every combination of
``--batch`` x ``--new-tokens`` x ``--modes`` (``greedy``: temperature 0; ``sampled``: temperature
1, one seed per request) every engine answers the same ``batch`` concurrent ``generate`` calls of
exactly ``new-tokens`` tokens (no stop tokens) on the same prompts: one warm-up, then
``--repeats`` timed runs, alternating between the engines so that drifting machine load hits
them alike. Printed per combination and engine: the median seconds, requests/s and tokens/s, and
the ratio of tokens/s to torchgen's (above 1: faster than torchgen); ``--json PATH`` writes the
same figures; ``--quick`` is a smoke run (batch 8, 16 new tokens, 2 repeats: a few minutes, most
of them the server starts).

On a machine without a GPU the workers use the settings the plugins' tests use: one OpenMP
thread per server, vLLM eager mode with the engine core in the API server's process and a 1 GiB
KV cache (``VLLM_CPU_KVCACHE_SPACE=1``), and for SGLang the tests' CPU stand-in for ``sgl_kernel``
(test support, not product: SGLang's CPU kernels are not on PyPI) on the server's ``PYTHONPATH``.
``--option ENGINE:NAME=VALUE`` (repeatable; VALUE is JSON, else a string) sets any option of an
engine by its Python name, e.g. ``--option vllm:vllm_enforce_eager=false``.

The full measurement on this repository's 2-core CPU machine (an estimate: about 10 minutes, of
which the three engines' start, in parallel, took 2-3.5 minutes on the loaded machine; ``--quick``
took 5 minutes there)::

    OMP_NUM_THREADS=1 /work/venv/bin/python benchmarks/bench_engines.py \\
        --sglang-python /work/venv-sglang/bin/python --vllm-python /work/venv-vllm/bin/python \\
        --batch 8,64 --new-tokens 64 --modes greedy,sampled --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ENGINES = ("torchgen", "sglang", "vllm")
#: The modules a worker's interpreter needs, per engine.
NEEDS = {"torchgen": ("plasmid_torchgen", "plasmid_torch"), "sglang": ("plasmid_sglang", "plasmid_torch", "sglang"),
         "vllm": ("plasmid_vllm", "plasmid_torch", "vllm")}
MODES = {"greedy": 0.0, "sampled": 1.0}
#: Protocol lines of a worker on its stdout start with this (engines may print there too).
TAG = "BENCH "
REPO = Path(__file__).resolve().parent.parent
SGLANG_STANDIN = REPO / "plugins" / "generators" / "sglang" / "tests" / "cpu_kernel_standin"
MAX_POSITIONS = 512
#: The defaults of --batch, --new-tokens and --repeats, and those of --quick.
FULL: dict[str, Any] = {"batch": [8, 64], "new_tokens": [64], "repeats": 3}
QUICK: dict[str, Any] = {"batch": [8], "new_tokens": [16], "repeats": 2}


# ------------------------------------------------------------------------------------------ worker
def engine_defaults(engine: str) -> dict[str, Any]:
    """The engine's options on this machine (see the module docstring); ``--option`` overrides them."""
    import torch

    if engine == "torchgen":
        return {}
    gpu = torch.cuda.is_available()
    if engine == "sglang":
        if gpu:
            return {"sglang_startup_timeout": 900.0}
        path = os.pathsep.join(p for p in (str(SGLANG_STANDIN), os.environ.get("PYTHONPATH", "")) if p)
        return {"sglang_server_env": [f"PYTHONPATH={path}", "OMP_NUM_THREADS=1"], "sglang_startup_timeout": 900.0}
    defaults: dict[str, Any] = {"vllm_max_model_len": MAX_POSITIONS, "vllm_startup_timeout": 900.0}
    if not gpu:
        defaults.update(vllm_server_env=["OMP_NUM_THREADS=1", "VLLM_CPU_OMP_THREADS_BIND=nobind",
                                         "VLLM_ENABLE_V1_MULTIPROCESSING=0", "VLLM_CPU_KVCACHE_SPACE=1"],
                        vllm_distributed_executor_backend="uni", vllm_enforce_eager=True)
    return defaults


def say(message: dict[str, Any]) -> None:
    print(TAG + json.dumps(message), flush=True)


def worker(args: argparse.Namespace) -> None:
    """Build the engine, say ``ready``, then answer one timing request per stdin line until ``quit``."""
    import importlib

    import torch

    from plasmid.testing import build, make_config
    from plasmid.types import SamplingParams

    torch.set_num_threads(args.threads)
    plugin = importlib.import_module(f"plasmid_{args.worker}.plugin")
    options = {**engine_defaults(args.worker), **json.loads(args.options)}
    launch = time.perf_counter()
    engine = build("engine", args.worker, plugin, config=make_config(plugin, model=args.model, run_dir=args.run_dir,
                                                                     seed=args.seed, **options))
    say({"ready": True, "launch_seconds": time.perf_counter() - launch, "options": options,
         "gpu": torch.cuda.is_available()})
    loop = asyncio.new_event_loop()

    async def timed(request: dict[str, Any]) -> tuple[float, int]:
        temperature, seed = request["temperature"], request["seed"]
        params = [SamplingParams(temperature=temperature, max_new_tokens=request["new_tokens"],
                                 seed=None if temperature == 0 else seed + i) for i in range(len(request["prompts"]))]
        started = time.perf_counter()
        outputs = await asyncio.gather(*(engine.generate(p, q) for p, q in zip(request["prompts"], params,
                                                                                 strict=True)))
        return time.perf_counter() - started, sum(len(o.token_ids) for o in outputs)

    try:
        for line in sys.stdin:
            request = json.loads(line)
            if request == "quit":
                break
            seconds, tokens = loop.run_until_complete(timed(request))
            say({"seconds": seconds, "tokens": tokens})
    finally:
        loop.run_until_complete(engine.shutdown())
        loop.close()


# ------------------------------------------------------------------------------------------ orchestrator
class Worker:
    """One engine's worker process; its stderr goes to ``log``."""

    def __init__(self, engine: str, python: str, args: argparse.Namespace, model_dir: Path, work: Path,
                 options: dict[str, Any]) -> None:
        self.engine, self.log = engine, work / f"{engine}.log"
        command = [python, str(Path(__file__).resolve()), "--worker", engine, "--model", str(model_dir),
                   "--run-dir", str(work / f"run-{engine}"), "--seed", str(args.seed), "--threads", str(args.threads),
                   "--options", json.dumps(options)]
        self.stderr = self.log.open("w")
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                        text=True, bufsize=1)
        self.ready: dict[str, Any] | None = None

    def read(self) -> dict[str, Any]:
        """The worker's next protocol message; ``RuntimeError`` with its log's tail if it ended first."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(TAG):
                return dict(json.loads(line[len(TAG):]))
        self.process.wait()
        lines = self.log.read_text(errors="replace").splitlines()[-8:]
        tail = "\n".join(line if len(line) <= 300 else line[:300] + " ..." for line in lines)
        raise RuntimeError(f"the {self.engine} worker exited with status {self.process.returncode}:\n{tail}")

    def ask(self, request: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.write('"quit"\n')
                self.process.stdin.close()
                self.process.wait(timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self.stderr.close()


def missing_modules(python: str, engine: str) -> list[str]:
    """The modules of ``NEEDS[engine]`` that ``python`` cannot find (all of them when it does not run)."""
    probe = ("import importlib.util, sys; "
             "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")
    try:
        proc = subprocess.run([python, "-c", probe, *NEEDS[engine]], capture_output=True, text=True, timeout=120)
    except OSError:
        return list(NEEDS[engine])
    return proc.stdout.split() if proc.returncode == 0 else list(NEEDS[engine])


def parse_options(entries: list[str]) -> dict[str, dict[str, Any]]:
    """``ENGINE:NAME=VALUE`` entries -> engine -> {name: value} (VALUE as JSON, else the string)."""
    options: dict[str, dict[str, Any]] = {engine: {} for engine in ENGINES}
    for entry in entries:
        engine, _, assignment = entry.partition(":")
        name, equals, value = assignment.partition("=")
        if engine not in ENGINES or not name or not equals:
            raise SystemExit(f"bench_engines: --option {entry!r}: give ENGINE:NAME=VALUE, ENGINE one of "
                             f"{', '.join(ENGINES)}")
        try:
            options[engine][name] = json.loads(value)
        except json.JSONDecodeError:
            options[engine][name] = value
    return options


def int_list(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers separated by commas")
    return values


def mode_list(text: str) -> list[str]:
    modes = [part.strip() for part in text.split(",") if part.strip()]
    if not modes or any(mode not in MODES for mode in modes):
        raise argparse.ArgumentTypeError(f"{text!r}: give modes from {', '.join(MODES)}, separated by commas")
    return modes


def start_workers(args: argparse.Namespace, model_dir: Path, work: Path) -> dict[str, Worker]:
    """The workers of the engines whose interpreters have them, started together; the others skipped with a line."""
    options = parse_options(args.option)
    workers: dict[str, Worker] = {}
    for engine in args.engines:
        python = getattr(args, f"{engine}_python")
        if python is None:  # this interpreter, else the tox env of that engine
            tox = REPO / ".tox" / engine / "bin" / "python"
            python = sys.executable if not missing_modules(sys.executable, engine) or not tox.exists() else str(tox)
        missing = missing_modules(python, engine)
        if missing:
            print(f"skipped {engine}: {python} has no {', '.join(missing)} (give --{engine}-python)")
            continue
        workers[engine] = Worker(engine, python, args, model_dir, work, options[engine])
    results: dict[str, BaseException | dict[str, Any]] = {}

    def wait(engine: str) -> None:
        try:
            results[engine] = workers[engine].read()
        except RuntimeError as exc:
            results[engine] = exc

    threads = [threading.Thread(target=wait, args=(engine,)) for engine in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for engine in list(workers):
        result = results[engine]
        if isinstance(result, BaseException):
            print(f"skipped {engine}: {result}")
            workers.pop(engine).close()
        else:
            workers[engine].ready = result
            print(f"{engine}: ready in {result['launch_seconds']:.1f} s ({'GPU' if result['gpu'] else 'CPU'}; "
                  f"options {result['options']})")
    return workers


def orchestrate(args: argparse.Namespace) -> None:
    from plasmid_torch.hf import load_tokenizer
    from plasmid_torch.tiny import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        work = Path(tmp)
        model_dir = build_tiny_model(work / "model", seed=args.seed, num_heads=1, max_positions=MAX_POSITIONS)
        tokenizer = load_tokenizer(str(model_dir))
        rng = random.Random(args.seed)
        prompts = [tokenizer(f"{rng.randint(0, 99)}+{rng.randint(0, 99)}=")["input_ids"]
                   for _ in range(max(args.batch))]
        if max(len(p) for p in prompts) + max(args.new_tokens) > MAX_POSITIONS:
            raise SystemExit(f"bench_engines: --new-tokens {max(args.new_tokens)} does not fit the model's "
                             f"{MAX_POSITIONS} positions")
        workers = start_workers(args, model_dir, work)
        if not workers:
            raise SystemExit("bench_engines: no engine to measure")
        rows: list[dict[str, Any]] = []
        try:
            for batch in args.batch:
                for new_tokens in args.new_tokens:
                    for mode in args.modes:
                        request = {"prompts": prompts[:batch], "new_tokens": new_tokens,
                                   "temperature": MODES[mode], "seed": args.seed}
                        runs: dict[str, list[dict[str, Any]]] = {engine: [] for engine in workers}
                        for round_ in range(1 + args.repeats):  # a warm-up, then the timed runs
                            for engine, worker_ in list(workers.items()):
                                try:
                                    answer = worker_.ask(request)
                                except (RuntimeError, OSError) as exc:
                                    print(f"dropped {engine}: {exc}")
                                    workers.pop(engine).close()
                                    runs.pop(engine)
                                    continue
                                if round_:
                                    runs[engine].append(answer)
                        rows += summarize(batch, new_tokens, mode, runs)
        finally:
            for worker_ in workers.values():
                worker_.close()
        print_table(args, rows)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


def summarize(batch: int, new_tokens: int, mode: str, runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per engine: medians over the repeats, and tokens/s relative to torchgen's."""
    rows = []
    for engine, timed in runs.items():
        seconds = statistics.median(r["seconds"] for r in timed)
        tokens = statistics.median(r["tokens"] for r in timed)
        rows.append({"engine": engine, "batch": batch, "new_tokens": new_tokens, "mode": mode, "seconds": seconds,
                     "tokens": tokens, "requests_per_s": batch / seconds, "tokens_per_s": tokens / seconds})
    base = next((row["tokens_per_s"] for row in rows if row["engine"] == "torchgen"), None)
    for row in rows:
        row["vs_torchgen"] = row["tokens_per_s"] / base if base else None
    return rows


def print_table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    print(f"tiny Qwen2 (1 head of 64), median of {args.repeats} after a warm-up; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, torchgen torch threads {args.threads}")
    print(f"{'engine':>9} {'batch':>5} {'new':>5} {'mode':>8} {'ms':>9} {'requests/s':>11} {'tokens/s':>10} "
          f"{'vs torchgen':>11}")
    for row in rows:
        ratio = "-" if row["vs_torchgen"] is None else f"{row['vs_torchgen']:.2f}"
        print(f"{row['engine']:>9} {row['batch']:>5} {row['new_tokens']:>5} {row['mode']:>8} "
              f"{row['seconds'] * 1000:9.1f} {row['requests_per_s']:11.1f} {row['tokens_per_s']:10.0f} {ratio:>11}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=lambda t: [e for e in t.split(",") if e], default=list(ENGINES),
                        help="engines to measure, comma-separated (default: all three)")
    parser.add_argument("--batch", type=int_list, help="concurrent requests, comma-separated (default: 8,64)")
    parser.add_argument("--new-tokens", type=int_list, help="tokens per request, comma-separated (default: 64)")
    parser.add_argument("--modes", type=mode_list, default=list(MODES), help="greedy, sampled (comma-separated)")
    parser.add_argument("--repeats", type=int, help="timed repetitions, the median is reported (default: 3)")
    parser.add_argument("--quick", action="store_true",
                        help=f"small defaults for a smoke run: --batch {QUICK['batch'][0]} --new-tokens "
                             f"{QUICK['new_tokens'][0]} --repeats {QUICK['repeats']}")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the workers")
    parser.add_argument("--seed", type=int, default=0)
    for engine in ENGINES:
        parser.add_argument(f"--{engine}-python",
                            help=f"the interpreter that has plasmid-{engine} (default: this one, else the "
                                 f"repository's .tox/{engine}/bin/python where it exists)")
    parser.add_argument("--option", action="append", default=[], metavar="ENGINE:NAME=VALUE",
                        help="an engine option by its Python name (VALUE as JSON), repeatable")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    # the worker side (started by the orchestrator)
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = [engine for engine in args.engines if engine not in ENGINES]
    if unknown:
        parser.error(f"--engines: unknown {', '.join(unknown)} (choose from {', '.join(ENGINES)})")
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.worker:
        worker(args)
    else:
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress lines as they come
        orchestrate(args)


if __name__ == "__main__":
    main()
