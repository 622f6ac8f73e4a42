"""The documents of a fortunes corpus (bench/fortunes_corpus.sh) as the tokenizer benches hand
them to the `tokenizers` wheel: the text cut at lines that are "%", empty documents dropped --
what Weft's `--doc-separator %` reads, so both sides see the same documents."""


def read_documents(path):
    docs, cur = [], []
    text = open(path, encoding="utf-8", errors="replace").read()
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n").rstrip("\r") == "%":
            docs.append("".join(cur))
            cur = []
        else:
            cur.append(line)
    docs.append("".join(cur))
    return [d for d in docs if d]
