#!/usr/bin/env python3
"""Encodes sentences with an exported tokenizer.json and compares the ids with expected ones.

Usage: check_hf_tokenizer.py DIR CASES_JSON

DIR holds the tokenizer.json of a Weft Hugging Face export; CASES_JSON is a list of
{"text": ..., "ids": [...]}, the ids libsentencepiece (or the byte tokenizer) gives. Each text
must encode to exactly its ids with the `tokenizers` library, no special tokens added, and the
ids must decode back to the text. When tokenizer_config.json is there and transformers is
installed, its fast tokenizer must give the same ids. Exits 77 (a skip) when `tokenizers`
cannot be imported, 1 on a mismatch.
"""
import json
import os
import sys


def main():
    directory, cases_path = sys.argv[1], sys.argv[2]
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        print(f"SKIP: python3 cannot import tokenizers ({e})")
        return 77
    tokenizer = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    failures = 0
    for case in cases:
        ids = tokenizer.encode(case["text"], add_special_tokens=False).ids
        if ids != case["ids"]:
            failures += 1
            print(f"MISMATCH {case['text']!r}\n  tokenizers: {ids}\n  expected:   {case['ids']}")
            continue
        decoded = tokenizer.decode(ids)
        if decoded != case["text"]:
            failures += 1
            print(f"DECODE {case['text']!r} -> {decoded!r}")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        AutoTokenizer = None
    if AutoTokenizer is not None:
        fast = AutoTokenizer.from_pretrained(directory)
        for case in cases:
            ids = fast(case["text"])["input_ids"]
            if ids != case["ids"]:
                failures += 1
                print(f"TRANSFORMERS MISMATCH {case['text']!r}: {ids} != {case['ids']}")
    print(f"{len(cases)} sentences, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
