"""``plasmid score`` with installed reward packages and their options, as a user debugs a verifier."""

from __future__ import annotations

import json
import os
import subprocess
import sys

LINES = "\n".join([
    json.dumps({"response": "<think>maybe 3</think> The answer is \\boxed{4}. Answer: (B)", "label": "4"}),
    "<think>\\boxed{4}</think> so 5. Answer: (B)",
    json.dumps({"response": "no think tag, \\boxed{4}", "label": "4"}),
]) + "\n"


def score(*args, stdin=LINES):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "plasmid.app.cli", "score", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=120)


def test_math_with_its_think_tag_option_and_a_weighted_second_reward():
    proc = score("--plugins", "math,match", "--reward", "math", "--reward", "choice:0.5", "--math-think-tag",
                 "--label", "4")
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["components"]["math"] for r in results] == [1.0, 0.0, 0.0]
    # "4" names no option letter: the choice reward fails on every line, is reported, and scores 0
    assert all(r["components"]["choice"] == 0.0 and r["errors"][0].startswith("choice: MissingLabelError")
               for r in results)
    assert "reward 'choice' from plugin 'match'" in proc.stderr


def test_bad_input_exits_2_naming_the_line():
    proc = score("--plugins", "math", "--reward", "math", stdin='{"response": "\\boxed{1}", "label": "1"}\n{"label"\n')
    assert proc.returncode == 2
    assert json.loads(proc.stdout.splitlines()[0])["reward"] == 1.0
    assert "plasmid: error: stdin line 2: starts with '{' but is not valid JSON" in proc.stderr
