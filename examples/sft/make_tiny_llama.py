#!/usr/bin/env python3
"""Writes a tiny randomly initialised Llama as a Hugging Face model directory: config.json and
model.safetensors (fp32), as `save_pretrained` of a fresh LlamaForCausalLM of that shape would
write them, and a copy of a tokenizer.json beside them.

  make_tiny_llama.py --out DIR --tokenizer tokenizer.json [--vocab-size N] [--seed 1]

It stands in for a real checkpoint in the supervised fine-tuning example: Weft imports it as
it would Llama-3.2-1B (init_from_hf_dir). Standard library only (no torch), deterministic (the
same arguments give the same bytes). Weights as transformers initialises them: every matrix and
the embedding N(0, 0.02), the norms 1. The vocabulary defaults to the tokenizer's size (its
largest id + 1, added tokens included) rounded up to a multiple of 64; the model must have at
least that many rows.
"""
import argparse
import array
import json
import os
import random
import shutil
import struct
import sys

HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 176
CONTEXT = 256
INIT_STD = 0.02


def tokenizer_size(path):
    """The largest id of tokenizer.json (its vocabulary and added tokens) + 1."""
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok.get("added_tokens", [])]
    return max(ids) + 1


def tensors(vocab, rng):
    """(name, shape, values) of every parameter, in transformers' names."""
    head_dim = HIDDEN // HEADS

    def normal(*shape):
        n = 1
        for d in shape:
            n *= d
        return shape, [rng.gauss(0.0, INIT_STD) for _ in range(n)]

    def ones(n):
        return (n,), [1.0] * n

    yield "model.embed_tokens.weight", *normal(vocab, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", *ones(HIDDEN)
        yield p + "self_attn.q_proj.weight", *normal(HEADS * head_dim, HIDDEN)
        yield p + "self_attn.k_proj.weight", *normal(KV_HEADS * head_dim, HIDDEN)
        yield p + "self_attn.v_proj.weight", *normal(KV_HEADS * head_dim, HIDDEN)
        yield p + "self_attn.o_proj.weight", *normal(HIDDEN, HEADS * head_dim)
        yield p + "post_attention_layernorm.weight", *ones(HIDDEN)
        yield p + "mlp.gate_proj.weight", *normal(INTERMEDIATE, HIDDEN)
        yield p + "mlp.up_proj.weight", *normal(INTERMEDIATE, HIDDEN)
        yield p + "mlp.down_proj.weight", *normal(HIDDEN, INTERMEDIATE)
    yield "model.norm.weight", *ones(HIDDEN)
    yield "lm_head.weight", *normal(vocab, HIDDEN)


def write_safetensors(path, named):
    """The safetensors layout: an 8-byte little-endian header length, the JSON header (padded
    with spaces to a multiple of 8, so that the data is aligned), then the tensors' bytes."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape, values in named:
        data = array.array("f", values)
        if sys.byteorder != "little":
            data.byteswap()
        blob = data.tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def config(vocab):
    # Only keys Weft's importer knows (it refuses any other), with transformers' spelling.
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": INIT_STD,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": CONTEXT,
        "mlp_bias": False,
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": vocab,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the directory to write (created)")
    parser.add_argument("--tokenizer", required=True, help="a tokenizer.json to copy beside")
    parser.add_argument("--vocab-size", type=int, default=0,
                        help="rows of the embedding (default: the tokenizer's, rounded up to 64)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    me = os.path.basename(sys.argv[0])
    needed = tokenizer_size(args.tokenizer)
    vocab = args.vocab_size or -(-needed // 64) * 64
    if vocab < needed:
        sys.exit(f"{me}: --vocab-size {vocab} is below the {needed} ids of {args.tokenizer}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config(vocab), f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(args.out, "model.safetensors"),
                      tensors(vocab, random.Random(args.seed)))
    shutil.copyfile(args.tokenizer, os.path.join(args.out, "tokenizer.json"))
    print(f"wrote {args.out}: Llama, {LAYERS} layers, {HIDDEN} wide, vocab {vocab}, "
          f"context {CONTEXT}, random weights (seed {args.seed})")


if __name__ == "__main__":
    main()
