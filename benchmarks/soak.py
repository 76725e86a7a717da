"""Soak test: the quickstart trained for a while with faults injected at random.

    python benchmarks/soak.py --minutes 30                 # the figures quoted in notes
    python benchmarks/soak.py --minutes 3 --steps 40       # a quick look

It runs ``plasmid train`` (the CPU quickstart, reward ``soak-exact`` from
``benchmarks/soak_reward.py``) again and again in fresh run directories until the time is up,
each run in the next of ``--modes`` (in turn):

- ``local``: the quickstart as it is;
- ``async``: with ``--schedule async --partial-rollout`` (and ``--placement disaggregate``);
- ``remote``: reward ``remote`` against a scoring server this script runs on 127.0.0.1;
- ``agent``: ``--generate agent`` with the agent of ``soak_reward.py`` (one chat call);
- ``ray``: ``--runtime ray`` with 2 engines and 2 trainer workers.

While a run trains, faults are injected:

- ``sigkill`` (every mode): the driver is killed with SIGKILL at a random moment, then the run
  is resumed with ``--resume`` (when it had no checkpoint yet, nothing was kept and it starts again);
- ``engine-kill`` (ray): an engine actor's process (``ray::EngineHost``) gets SIGKILL, as the
  kernel's OOM killer sends it; the runtime must restart it, re-sync it and finish the step;
- ``trainer-kill`` (ray): a trainer worker's process gets SIGKILL; the run must end with exit 2
  and one error line naming the worker (no traceback), then ``--resume`` must train on;
- ``gateway-flood`` (agent): ``--flood-requests`` posts at the agent gateway at once, without a
  session key, with unknown keys, and with bodies over ``--agent-max-body``; each must be refused
  (401, 413) and the run must train on (an agent attempt floods at its first chance, then at random);
- ``remote-trickle`` (remote): the scoring server answers a fraction (``--trickle-p``) of requests
  one byte at a time, far past ``--rm-timeout``; the run must train on;
- ``reward-raise`` / ``reward-hang`` (the ``soak-exact`` modes): the reward raises, or blocks its
  event loop with ``time.sleep`` for ``--hang-seconds`` (far past ``--reward-timeout``), in a
  random fraction of calls (``--raise-p``, ``--hang-p``);
- ``hostile-math`` / ``hostile-code`` (the ``soak-exact`` modes): in a fraction of calls
  (``--hostile-p``) the real ``math`` or ``code`` reward grades a hostile answer
  (``\\boxed{1e50000000}``, ``9^{9^{9}}``, 3000 nested braces, runs of spaces; programs that
  rebind builtins or return an object whose ``__eq__`` always says yes) in the training process.

A fault is *survived* when the run it hit goes on: a killed driver (or a run ended by a killed
trainer worker) resumes and writes further steps; a killed engine's run, a flooded gateway's, a
trickled or failing reward's write a step after it; a hostile answer is graded 0.0 within
``SOAK_HOSTILE_BUDGET`` seconds (:mod:`soak_reward`) and the run writes a step after it. Reward
faults in a step that a SIGKILL then threw away are *superseded* (the step is redone), neither
survived nor failed. At the end of every run its ``metrics.jsonl`` must hold each step once, in
order, each trained on every sample the step asked for: anything short is counted in *samples
lost*, which must be 0. The tally prints each fault kind's injected / survived / superseded; the
last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLUGIN = HERE / "soak_reward.py"
#: the quickstart's plugins, the hostile graders', the remote reward's and the agent generator's; Ray's
#: joins them when a mode needs it (it may not be installed: a soak without ray mode runs without it)
PLUGINS = "tasks,hf,torchgen,rollout,grpo,torchtrain,sync,math,code,remote,agent"
MODES = ("local", "async", "remote", "agent", "ray")
#: the faults the soak injects from outside the run (the reward-side ones have probabilities instead)
FAULTS = ("sigkill", "engine-kill", "trainer-kill", "gateway-flood")
#: the environment variable (set to the work directory) that marks this soak's processes
MARKER = "SOAK_WORK"
#: seconds the scoring server waits between the bytes of a trickled answer
TRICKLE_SECONDS = 0.5


@dataclass
class Tally:
    injected: Counter[str] = field(default_factory=Counter)
    survived: Counter[str] = field(default_factory=Counter)
    superseded: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    steps: int = 0
    steps_redone: int = 0
    samples_lost: int = 0
    runs: list[dict[str, object]] = field(default_factory=list)

    def kinds(self) -> dict[str, dict[str, int]]:
        """Each fault kind's injected / survived / superseded counts."""
        return {kind: {"injected": self.injected[kind], "survived": self.survived[kind],
                       "superseded": self.superseded[kind]} for kind in sorted(self.injected)}


def plasmid_command() -> list[str]:
    found = shutil.which("plasmid", path=str(Path(sys.executable).parent)) or shutil.which("plasmid")
    if found is None:
        sys.exit("soak: the plasmid command is not installed in this environment")
    return [found]


def read_metrics(path: Path) -> list[dict[str, object]]:
    """The complete lines of ``metrics.jsonl`` (a torn last line is ignored)."""
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def checkpointed_steps(run_dir: Path) -> int:
    """How many steps the run's newest complete checkpoint holds (0: none)."""
    root = run_dir / "checkpoints"
    metas = [p / "meta.json" for p in root.iterdir() if not p.name.endswith(".partial")] if root.is_dir() else []
    return max((json.loads(m.read_text())["rollout_id"] + 1 for m in metas if m.is_file()), default=0)


def actor_pids(kind: str, work: Path) -> list[int]:
    """Pids of this soak's Ray actors of class ``kind`` (``EngineHost``, ``TrainerWorker``): their
    command line names it and their environment carries :data:`MARKER` (other clusters on the
    machine are left alone)."""
    needle = f"{MARKER}={work}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                if cmdline.startswith(f"ray::{kind}".encode()) and needle in \
                        Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def reward_faults(log: Path, since: float) -> list[dict[str, object]]:
    """The faults ``soak_reward.py`` injected since ``since``; a hostile answer's outcome line is
    merged into its injection line (``score``/``error``, ``seconds``)."""
    if not log.is_file():
        return []
    faults: list[dict[str, object]] = []
    by_id: dict[str, dict[str, object]] = {}
    for fault in map(json.loads, log.read_text().splitlines()):
        if "id" in fault and not fault.get("injected"):
            if fault["id"] in by_id:
                by_id[fault["id"]].update({k: fault[k] for k in ("score", "error", "seconds", "budget") if k in fault})
            continue
        if fault["time"] >= since:
            faults.append(fault)
            if "id" in fault:
                by_id[str(fault["id"])] = fault
    return faults


def last_step_written_at(metrics: Path) -> float:
    return metrics.stat().st_mtime if metrics.is_file() else 0.0


class ScoringServer:
    """The ``remote`` reward's server: exact match of the response against the label; a fraction
    ``trickle_p`` of answers is sent one byte every :data:`TRICKLE_SECONDS` (each such answer's
    start time is kept in ``trickled``)."""

    def __init__(self, trickle_p: float, seed: int) -> None:
        self.trickle_p, self.rng, self.trickled = trickle_p, random.Random(seed), []
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                label = request.get("label")
                answers = label if isinstance(label, list) else [label]
                score = float(any(str(request.get("response", "")).strip() == str(a).strip() for a in answers))
                body = json.dumps({"reward": score}).encode()
                with server.lock:
                    trickle = server.rng.random() < server.trickle_p
                    if trickle:
                        server.trickled.append(time.time())
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    for index in range(len(body)):
                        self.wfile.write(body[index:index + 1])
                        self.wfile.flush()
                        if trickle:
                            time.sleep(TRICKLE_SECONDS)
                except OSError:
                    pass  # the reward gave up on it: what it should do

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def trickled_since(self, since: float) -> list[float]:
        with self.lock:
            return [when for when in self.trickled if when >= since]


def flood_gateway(gateway: str, requests: int, max_body: int) -> Counter[str]:
    """``requests`` posts at the agent gateway at once: a third without a key, a third with an
    unknown key, a third declaring a body over ``max_body``; the answers' statuses counted
    (``"error"``: the connection failed)."""
    parts = urllib.parse.urlsplit(gateway)
    chat = json.dumps({"model": "plasmid", "messages": [{"role": "user", "content": "1+1="}]}).encode()

    def post(index: int) -> str:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
        try:
            if index % 3 == 0:
                connection.request("POST", "/v1/chat/completions", body=chat,
                                   headers={"Content-Type": "application/json"})
            elif index % 3 == 1:
                connection.request("POST", f"/s/soak-{index:06d}/v1/chat/completions", body=chat,
                                   headers={"Content-Type": "application/json", "Authorization": "Bearer forged"})
            else:  # declares more than the gateway reads, sends a little of it
                connection.putrequest("POST", "/v1/chat/completions")
                connection.putheader("Content-Length", str(max_body * 8))
                connection.putheader("Content-Type", "application/json")
                connection.endheaders(b"{" + b" " * 65536)
            return str(connection.getresponse().status)
        except OSError:
            return "error"
        finally:
            connection.close()

    with ThreadPoolExecutor(16) as pool:
        return Counter(pool.map(post, range(requests)))


def soak(args: argparse.Namespace) -> Tally:
    rng = random.Random(args.seed)
    work = Path(args.work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    fault_log = work / "reward_faults.jsonl"
    env = {**os.environ, "SOAK_RAISE_P": str(args.raise_p), "SOAK_HANG_P": str(args.hang_p),
           "SOAK_HANG_SECONDS": str(args.hang_seconds), "SOAK_FAULT_LOG": str(fault_log),
           "SOAK_HOSTILE_P": str(args.hostile_p), "SOAK_GATEWAY_FILE": str(work / "gateway"), MARKER: str(work),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg", "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    server = ScoringServer(args.trickle_p, args.seed) if "remote" in args.modes else None
    tally = Tally()
    deadline = time.monotonic() + args.minutes * 60
    run_index = 0
    while time.monotonic() < deadline and (args.runs is None or run_index < args.runs):
        mode = args.modes[run_index % len(args.modes)]
        run_dir = work / f"run-{run_index:02d}-{mode}"
        # a fixed plugin set: packages installed meanwhile must not change the run a --resume continues
        plugins = f"{PLUGINS},ray" if "ray" in args.modes else PLUGINS
        base = [*plasmid_command(), "train", "--plugins", f"{plugins},{PLUGIN}", "--reward-timeout",
                str(args.reward_timeout), "--num-rollouts", str(args.steps), "--save-interval", str(args.save_interval),
                "--eval-interval", str(args.eval_interval), "--prompts-per-step", str(args.prompts),
                "--n-samples-per-prompt", str(args.samples), "--run-dir", str(run_dir), *mode_flags(mode, server)]
        finished = soak_one_run(base, run_dir, mode, rng, env, fault_log, deadline, args, tally, server)
        check_run(run_dir, args.steps if finished else None, tally, mode, args)
        run_index += 1
    return tally


def mode_flags(mode: str, server: ScoringServer | None) -> list[str]:
    """The ``plasmid train`` flags of one mode (see the module docstring)."""
    if mode == "remote":
        assert server is not None
        return ["--reward", "remote", "--rm-url", server.url, "--rm-timeout", "2", "--rm-retries", "0"]
    if mode == "agent":
        return ["--generate", "agent", "--agent", f"{PLUGIN}:answer", "--agent-timeout", "60", "--reward", "agent"]
    flags = ["--reward", "soak-exact"]
    if mode == "async":
        flags += ["--schedule", "async", "--partial-rollout", "--placement", "disaggregate"]
    if mode == "ray":
        flags += ["--runtime", "ray", "--engines", "2", "--trainer-workers", "2", "--placement", "disaggregate",
                  "--ray-num-cpus", "6", "--weight-sync", "objectstore",
                  "--ray-engine-restarts", "1000"]  # survival is measured here, not the restart budget
    return flags


def one_error_line(log: str, *parts: str) -> str | None:
    """What is wrong with a run's ending on an error, or None: one ``plasmid: error:`` line naming
    ``parts``, and no traceback."""
    errors = [line for line in log.splitlines() if line.startswith("plasmid: error:")]
    if len(errors) != 1:
        return f"{len(errors)} error lines"
    if "Traceback" in log:
        return "a traceback"
    missing = [part for part in parts if part not in errors[0]]
    return f"the error line lacks {missing}: {errors[0][:300]}" if missing else None


def soak_one_run(base: list[str], run_dir: Path, mode: str, rng: random.Random, env: dict[str, str],
                 fault_log: Path, deadline: float, args: argparse.Namespace, tally: Tally,
                 server: ScoringServer | None) -> bool:
    """Train one run to its end through faults; True when it completed ``--steps`` steps."""
    pending: list[tuple[str, float]] = []  # kills whose run has not resumed past them yet
    unexpected = 0
    work = run_dir.parent
    while True:
        kept = checkpointed_steps(run_dir)
        resume = kept > 0
        if not resume and run_dir.exists():
            shutil.rmtree(run_dir)  # killed before the first checkpoint: nothing was kept
        written = len(read_metrics(run_dir / "metrics.jsonl"))
        tally.steps_redone += max(0, written - kept)
        before = min(written, kept)
        started = time.time()
        log_path = run_dir.with_suffix(".log")
        log_start = log_path.stat().st_size if log_path.exists() else 0
        (work / "gateway").unlink(missing_ok=True)
        with log_path.open("a") as log:
            process = subprocess.Popen([*base, *(["--resume"] if resume else [])], stdout=log,
                                       stderr=subprocess.STDOUT, env=env, start_new_session=True)
            fault_at = time.monotonic() + rng.uniform(args.fault_min, args.fault_max)
            killed = False
            sigkilled_at: float | None = None
            trainer_killed_at: float | None = None
            flooded = False  # an agent attempt floods at its first chance (its gateway is up only while agents run)
            survivable: list[tuple[str, float]] = []  # faults survived once a step is written after them
            while process.poll() is None:
                time.sleep(0.2)
                now = time.monotonic()
                if now >= deadline and not killed and (not pending or now >= deadline + 300):
                    process.send_signal(signal.SIGTERM)  # time is up: stop the way an operator would
                    killed = True
                    try:
                        process.wait(timeout=120)
                    except subprocess.TimeoutExpired:
                        os.killpg(process.pid, signal.SIGKILL)
                    break
                if now < fault_at or killed or trainer_killed_at is not None:
                    continue
                fault_at = now + rng.uniform(args.fault_min, args.fault_max)
                # this attempt trained a step (a resume first cuts metrics.jsonl back to its checkpoint: the lines
                # of steps it redoes are not this attempt's)
                metrics = run_dir / "metrics.jsonl"
                trained = last_step_written_at(metrics) > started and len(read_metrics(metrics)) > before
                draw, faults = rng.random(), args.faults
                if (mode == "ray" and draw < 0.4 and "engine-kill" in faults
                        and (pids := actor_pids("EngineHost", work))):
                    os.kill(rng.choice(pids), signal.SIGKILL)
                    tally.injected["engine-kill"] += 1
                    survivable.append(("engine-kill", time.time()))
                    continue
                if (mode == "ray" and draw < 0.7 and trained and "trainer-kill" in faults
                        and (pids := actor_pids("TrainerWorker", work))):
                    os.kill(rng.choice(pids), signal.SIGKILL)
                    tally.injected["trainer-kill"] += 1
                    trainer_killed_at = time.time()
                    continue
                if (mode == "agent" and (draw < 0.6 or not flooded) and "gateway-flood" in args.faults
                        and (work / "gateway").is_file()):
                    flooded = True
                    answers = flood_gateway((work / "gateway").read_text(), args.flood_requests, 1 << 20)
                    tally.injected["gateway-flood"] += 1
                    wrong = {status: n for status, n in answers.items() if status not in ("401", "413", "error")}
                    if wrong:
                        tally.failures.append(f"{run_dir.name}: the gateway answered a flood with {wrong}")
                    else:
                        survivable.append(("gateway-flood", time.time()))
                    continue
                if trained and "sigkill" in args.faults:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    tally.injected["sigkill"] += 1
                    sigkilled_at = time.time()
                    killed = True
        code = process.wait()
        metrics = run_dir / "metrics.jsonl"
        wrote_at = last_step_written_at(metrics)
        entries = read_metrics(metrics)
        if pending and len(entries) > before and wrote_at > started:
            for kind, _ in pending:
                tally.survived[kind] += 1  # resumed and trained on after the kill
            pending = []
        if sigkilled_at is not None:
            pending.append(("sigkill", sigkilled_at))
        for kind, when in survivable:
            survived = wrote_at > when + 0.5 or code == 0
            tally.survived[kind] += survived
            if not survived:
                tally.failures.append(f"{run_dir.name}: no step after a {kind} (exit {code})")
        if server is not None and mode == "remote":
            for when in server.trickled_since(started):
                tally.injected["remote-trickle"] += 1
                if wrote_at > when + 2.0 or code == 0:
                    tally.survived["remote-trickle"] += 1
                elif killed:
                    tally.superseded["remote-trickle"] += 1
                else:
                    tally.failures.append(f"{run_dir.name}: a remote-trickle was not survived (exit {code})")
        for fault in reward_faults(fault_log, started):
            kind = str(fault["kind"])
            tally.injected[kind] += 1
            if kind.startswith("hostile-") and "score" not in fault:
                if "error" in fault:
                    tally.failures.append(f"{run_dir.name}: {kind} {fault['case']}: the grader raised {fault['error']}")
                else:
                    tally.superseded[kind] += 1  # the process ended before the grade came back
                continue
            if kind.startswith("hostile-") and (fault["score"] != 0.0 or fault["seconds"] > fault["budget"]):
                tally.failures.append(f"{run_dir.name}: {kind} {fault['case']} scored {fault['score']} in "
                                      f"{fault['seconds']} s (budget {fault['budget']} s)")
            elif wrote_at > float(fault["time"]) + args.reward_timeout or code == 0:
                tally.survived[kind] += 1
            elif killed or trainer_killed_at is not None:  # its step was thrown away by an injected kill
                tally.superseded[kind] += 1
            else:
                tally.failures.append(f"{run_dir.name}: a {kind} was not survived (exit {code})")
        if trainer_killed_at is not None:
            with log_path.open(errors="replace") as handle:
                handle.seek(log_start)
                problem = one_error_line(handle.read(), "trainer worker rank", "--resume")
            if code != 2 or problem:
                tally.failures.append(f"{run_dir.name}: a trainer-kill ended the run with exit {code}"
                                      f" ({problem or 'expected 2'})")
            else:
                pending.append(("trainer-kill", trainer_killed_at))
                continue  # resume
        if killed and time.monotonic() >= deadline:
            return code == 0 and len(entries) >= args.steps
        if killed:
            continue
        if code == 0:
            for kind, _ in pending:  # resumed and ran to the end
                tally.survived[kind] += 1
            return True
        unexpected += 1
        tally.failures.append(f"{run_dir.name}: plasmid exited {code} unprompted; see {log_path}")
        if unexpected >= 3:
            return False


def check_run(run_dir: Path, expected_steps: int | None, tally: Tally, mode: str, args: argparse.Namespace) -> None:
    """Count the run's steps and every sample it should have trained on but did not."""
    entries = read_metrics(run_dir / "metrics.jsonl")
    steps = [int(entry["step"]) for entry in entries]  # type: ignore[call-overload]
    if steps != list(range(len(steps))):
        tally.failures.append(f"{run_dir.name}: metrics.jsonl steps are not 0..{len(steps) - 1} once each: {steps}")
    total = expected_steps if expected_steps is not None else len(steps)
    trained = {int(e["step"]): int(e.get("train/samples", 0)) for e in entries}  # type: ignore[call-overload]
    lost = sum(args.prompts * args.samples - trained.get(step, 0) for step in range(total))
    tally.samples_lost += lost
    tally.steps += len(set(steps))
    evals = [float(e["eval/accuracy"]) for e in entries if e.get("eval/accuracy") is not None]  # type: ignore[arg-type]
    tally.runs.append({"run": run_dir.name, "mode": mode, "steps": len(set(steps)),
                       "completed": expected_steps is not None, "final_eval_accuracy": evals[-1] if evals else None,
                       "samples_lost": lost})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=None, help="stop after this many runs (default: when time is up)")
    parser.add_argument("--steps", type=int, default=200, help="steps per run")
    parser.add_argument("--save-interval", type=int, default=10)
    parser.add_argument("--eval-interval", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=32, help="--prompts-per-step of every run")
    parser.add_argument("--samples", type=int, default=8, help="--n-samples-per-prompt of every run")
    parser.add_argument("--modes", default=",".join(MODES), help=f"runs take these modes in turn ({', '.join(MODES)})")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"faults injected from outside the run ({', '.join(FAULTS)})")
    parser.add_argument("--fault-min", type=float, default=15.0, help="seconds between driver/actor faults, at least")
    parser.add_argument("--fault-max", type=float, default=60.0)
    parser.add_argument("--raise-p", type=float, default=0.002, help="probability that a reward call raises")
    parser.add_argument("--hang-p", type=float, default=0.0005, help="probability that a reward call hangs")
    parser.add_argument("--hang-seconds", type=float, default=30.0, help="how long a hanging reward call blocks")
    parser.add_argument("--hostile-p", type=float, default=0.002,
                        help="probability that a reward call also grades a hostile math or code answer")
    parser.add_argument("--trickle-p", type=float, default=0.005,
                        help="probability that the remote scoring server trickles an answer")
    parser.add_argument("--flood-requests", type=int, default=60, help="posts in one gateway flood")
    parser.add_argument("--reward-timeout", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default=str(HERE.parent / "runs" / "soak"))
    args = parser.parse_args(argv)
    args.modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    args.faults = [fault.strip() for fault in args.faults.split(",") if fault.strip()]
    for flag, given, known in (("--modes", args.modes, MODES), ("--faults", args.faults, FAULTS)):
        unknown = sorted(set(given) - set(known))
        if unknown or (flag == "--modes" and not given):
            parser.error(f"{flag} {','.join(given)}: unknown {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(known)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    tally = soak(args)
    for run in tally.runs:
        print(json.dumps(run))
    for failure in tally.failures:
        print("FAILURE:", failure)
    for kind, counts in tally.kinds().items():
        print(f"{kind:<16} injected {counts['injected']:>4}  survived {counts['survived']:>4}  "
              f"superseded {counts['superseded']:>4}")
    print(f"minutes {(time.monotonic() - began) / 60:.1f}  steps {tally.steps} (redone after kills: "
          f"{tally.steps_redone})  faults injected {sum(tally.injected.values())}  survived "
          f"{sum(tally.survived.values())}  superseded {sum(tally.superseded.values())}  samples lost "
          f"{tally.samples_lost}")
    completed = [run for run in tally.runs if run["final_eval_accuracy"] is not None]
    summary = {"minutes": round((time.monotonic() - began) / 60, 1), "steps": tally.steps,
               "steps_redone": tally.steps_redone, "kinds": tally.kinds(),
               "injected": sum(tally.injected.values()), "survived": sum(tally.survived.values()),
               "superseded": sum(tally.superseded.values()), "failures": len(tally.failures),
               "samples_lost": tally.samples_lost,
               "final_eval_accuracy": completed[-1]["final_eval_accuracy"] if completed else None}
    print(json.dumps(summary))
    return 1 if tally.failures or tally.samples_lost else 0


if __name__ == "__main__":
    sys.exit(main())
