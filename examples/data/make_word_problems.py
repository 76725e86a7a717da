"""Write the one-step arithmetic word problems of ``examples/smollm2-arithmetic.yaml`` and of
``benchmarks/bench_real_model.py``: ``word-problems-train.jsonl`` and ``word-problems-eval.jsonl``.

Each row is ``{"prompt": ..., "label": "<integer>"}``: a short story with two numbers (2-20) and
one operation (addition, subtraction with a non-negative result, multiplication of a count of
groups), asked in plain English, ending with the format request "Give the final answer as a number
after 'Answer:'." (the ``math`` reward takes such an "Answer: ..." sentence, else the last number).
The two files share no prompt. (An earlier wording, "End with 'Answer: N'.", made SmolLM2 write the
letter N itself.)

    python examples/data/make_word_problems.py            # rewrites both files (seed 0)
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = ("Ana", "Ben", "Chloe", "Dev", "Ella", "Finn", "Grace", "Hugo", "Iris", "Jay", "Kim", "Leo", "Maya", "Noah")
THINGS = ("apples", "marbles", "books", "stickers", "pencils", "cookies", "shells", "coins", "cards", "stamps")
CONTAINERS = ("bags", "boxes", "jars", "baskets", "rows", "piles")
FORMAT = "Give the final answer as a number after 'Answer:'."


def problem(rng: random.Random) -> tuple[str, int]:
    """One word problem and its integer answer."""
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    kind = rng.choice(("add", "add", "sub", "sub", "mul"))
    if kind == "add":
        text = rng.choice((f"{name} has {a} {thing}. {name} gets {b} more. How many {thing} does {name} have now?",
                           f"There are {a} {thing} on a table and {b} {thing} on a shelf. How many {thing} are "
                           f"there in all?"))
        return text, a + b
    if kind == "sub":
        a, b = max(a, b), min(a, b)
        text = rng.choice((f"{name} has {a} {thing} and gives away {b}. How many {thing} are left?",
                           f"A shop had {a} {thing}. It sold {b} of them. How many {thing} does the shop have "
                           f"now?"))
        return text, a - b
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    container = rng.choice(CONTAINERS)
    return f"{name} has {a} {container} with {b} {thing} in each. How many {thing} does {name} have?", a * b


def rows(count: int, rng: random.Random, exclude: set[str]) -> list[dict[str, str]]:
    """``count`` rows of distinct prompts, none in ``exclude`` (which grows)."""
    made = []
    while len(made) < count:
        text, answer = problem(rng)
        prompt = f"{text} {FORMAT}"
        if prompt in exclude:
            continue
        exclude.add(prompt)
        made.append({"prompt": prompt, "label": str(answer)})
    return made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--eval", type=int, default=100)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    seen: set[str] = set()
    evaluation = rows(args.eval, rng, seen)
    training = rows(args.train, rng, seen)
    for name, data in (("word-problems-train.jsonl", training), ("word-problems-eval.jsonl", evaluation)):
        (HERE / name).write_text("".join(json.dumps(row) + "\n" for row in data), encoding="utf-8")


if __name__ == "__main__":
    main()
