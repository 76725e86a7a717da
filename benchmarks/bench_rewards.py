"""Speed of the ``math`` and ``code`` rewards on honest answers: this tree against an earlier one.

The graders were hardened against hostile answers (issue 33: exact integers and rationals, every
parse bounded before it starts, verdicts decided on the host, the extension-module guard). This
measures what that cost on the labelled sets the plugins' own tests pin down: every case of
``plugins/rewards/math/tests/test_math_table.py`` (``CASES``, ~150 responses with their labels)
and of ``plugins/rewards/code/tests/test_code_scores.py`` (``SCORES``, a dozen programs run in the
sandbox against stdin tests and asserts). The hostile answers are not in these sets.

Each side runs in a process of its own, the same way: the reward is built through the plugin
(``plasmid.testing.build``), scored once on every case to warm up, then ``--rounds`` times over
the whole set, one sample after another (the code reward's sandbox runs each program in a child
process). The baseline is the plugins' source at ``--baseline`` (default: the commit before the
hardening), exported from git and put first on ``sys.path``; the kernel is this tree's for both.
Printed: samples/s (median of the rounds), the baseline's, the ratio this/baseline (above 1:
faster) and each process's peak RSS.

    OMP_NUM_THREADS=1 python benchmarks/bench_rewards.py --rounds 5
"""

from __future__ import annotations

import argparse
import ast
import json
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the commit before the graders' hardening (523e6af: the math reward; faea256, cd3fd27: the code reward)
BEFORE_HARDENING = "84433ff"
SETS = {
    "math": ("plugins/rewards/math", "plugins/rewards/math/tests/test_math_table.py", "CASES"),
    "code": ("plugins/rewards/code", "plugins/rewards/code/tests/test_code_scores.py", "SCORES"),
}


def labelled_cases(reward: str) -> list[tuple[str, object]]:
    """``[(response, label), ...]`` of ``reward``'s labelled set: the table's assignment (and the
    code set's ``ADD_LABEL``/``ADD_PROGRAM``) taken from its test module and run alone, so neither
    pytest nor the plugin is imported here."""
    _, test_file, table = SETS[reward]
    tree = ast.parse((ROOT / test_file).read_text())
    wanted = {table, "ADD_LABEL", "ADD_PROGRAM"}
    kept = [node for node in tree.body if isinstance(node, ast.Assign)
            and any(isinstance(target, ast.Name) and target.id in wanted for target in node.targets)]
    namespace: dict[str, object] = {}
    exec(compile(ast.Module(body=kept, type_ignores=[]), test_file, "exec"), namespace)  # our own table
    rows = namespace[table]
    assert isinstance(rows, list)
    if reward == "math":
        return [(response, label) for response, label, _ in rows]
    return [(response, namespace["ADD_LABEL"]) for _, response, _ in rows]


def worker(reward: str, rounds: int) -> dict[str, float]:
    """Score ``reward``'s labelled set ``rounds`` times in this process (see the module docstring)."""
    import importlib

    from plasmid.testing import build, make_config, run
    from plasmid.types import Sample

    plugin = importlib.import_module(f"plasmid_{reward}.plugin")
    scorer = build("reward", reward, plugin, config=make_config(plugin))
    cases = labelled_cases(reward)

    def one_pass() -> float:
        started = time.perf_counter()
        for response, label in cases:
            run(scorer(Sample(response=response, label=label)))
        return time.perf_counter() - started

    one_pass()
    seconds = [one_pass() for _ in range(rounds)]
    return {"samples": len(cases), "samples_per_second": len(cases) / statistics.median(seconds),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "source": str(Path(plugin.__file__).resolve().parent)}


def export_sources(revision: str, into: Path) -> Path:
    """The math and code plugins' ``src`` folders at ``revision``, merged under ``into``."""
    paths = [f"{package}/src" for package, _, _ in SETS.values()]
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{revision}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        print(f"bench_rewards: error: --baseline {revision} is not a commit of this clone (a shallow clone? "
              f"fetch its history)", file=sys.stderr)
        raise SystemExit(2)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", revision, *paths],
                             check=True, capture_output=True).stdout
    with tempfile.TemporaryFile() as handle:
        handle.write(archive)
        handle.seek(0)
        with tarfile.open(fileobj=handle) as tar:
            tar.extractall(into, filter="data")
    merged = into / "site"
    merged.mkdir()
    for path in paths:
        for package in (into / path).iterdir():
            if package.is_dir() and not package.name.endswith(".egg-info"):
                package.rename(merged / package.name)
    return merged


def measure(reward: str, rounds: int, first_on_path: Path | None) -> dict[str, float]:
    """:func:`worker` in a fresh interpreter, with ``first_on_path`` ahead of the installed plugins."""
    command = [sys.executable, __file__, "--worker", reward, "--rounds", str(rounds)]
    command += ["--first-on-path", str(first_on_path)] if first_on_path is not None else []
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"the {reward} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed passes over each set (median reported)")
    parser.add_argument("--baseline", default=BEFORE_HARDENING, help="git revision of the baseline graders")
    parser.add_argument("--rewards", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--worker", choices=list(SETS), help=argparse.SUPPRESS)
    parser.add_argument("--first-on-path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if args.first_on_path:
            sys.path.insert(0, args.first_on_path)
        print(json.dumps(worker(args.worker, args.rounds)))
        return
    with tempfile.TemporaryDirectory() as temporary:
        old = export_sources(args.baseline, Path(temporary))
        print(f"{'reward':6} {'samples':>7} {'this /s':>9} {'baseline /s':>12} {'ratio':>6} "
              f"{'RSS MB':>7} {'base RSS':>8}")
        for reward in args.rewards:
            now, before = measure(reward, args.rounds, None), measure(reward, args.rounds, old)
            assert before["source"].startswith(temporary), f"the baseline loaded {before['source']}"
            ratio = now["samples_per_second"] / before["samples_per_second"]
            print(f"{reward:6} {now['samples']:7.0f} {now['samples_per_second']:9.1f} "
                  f"{before['samples_per_second']:12.1f} {ratio:6.2f} {now['peak_rss_mb']:7.0f} "
                  f"{before['peak_rss_mb']:8.0f}")


if __name__ == "__main__":
    main()
