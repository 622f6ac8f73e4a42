#!/usr/bin/env python3
"""Writes the example's synthetic chat data: short arithmetic conversations, one JSON object a
line, in the form `trainctl data prepare --chat` reads ({"messages": [...]}).

  make_conversations.py [--count 320] [--seed 1] > conversations.jsonl

Standard library only, and deterministic: the same arguments give the same bytes (the
committed conversations.jsonl is the default run). The answers follow a fixed pattern ("12 + 7
= 19."), so even a tiny model trained from random weights quickly learns most of each answer
and its loss visibly drops; the sums themselves take much longer.
"""
import argparse
import json
import random
import sys

SYSTEM = "You are a calculator."

# (question, the operator its answer writes)
QUESTIONS = [
    ("What is {a} plus {b}?", "+"),
    ("What is {a} + {b}?", "+"),
    ("What is {a} minus {b}?", "-"),
    ("What is {a} times {b}?", "*"),
]
FOLLOW_UPS = [("And {a} plus {b}?", "+"), ("Now {a} minus {b}?", "-"), ("And {a} times {b}?", "*")]


def turn(rng, template, symbol):
    """One question and its answer."""
    a, b = rng.randrange(0, 20), rng.randrange(0, 20)
    if symbol == "-" and b > a:
        a, b = b, a  # no negative answers: one less pattern to learn
    result = {"+": a + b, "-": a - b, "*": a * b}[symbol]
    return ({"role": "user", "content": template.format(a=a, b=b)},
            {"role": "assistant", "content": f"{a} {symbol} {b} = {result}."})


def conversation(rng):
    messages = [{"role": "system", "content": SYSTEM}, *turn(rng, *rng.choice(QUESTIONS))]
    # One in three goes on with a second question, so that some conversations have two
    # assistant turns (both are targets, the user's turn between them is not).
    if rng.randrange(3) == 0:
        messages.extend(turn(rng, *rng.choice(FOLLOW_UPS)))
    return {"messages": messages}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=320, help="conversations to write")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    for _ in range(args.count):
        sys.stdout.write(json.dumps(conversation(rng)) + "\n")


if __name__ == "__main__":
    main()
