#!/usr/bin/env python3
"""Does a `trainctl model export` directory make text in transformers on its own?

  bench/check_hf_export.py DIR [--prompt TEXT] [--new-tokens 20] [--device cuda|cpu]
  bench/check_hf_export.py --model MODEL.safetensors --trainctl BIN/trainctl [...]
      (exports MODEL to a temporary directory first, with `trainctl model export`)

Loads DIR with pipeline("text-generation", model=DIR) (the fast tokenizer from
tokenizer.json, generation settings from generation_config.json), generates --new-tokens
tokens greedily after the prompt and prints
  BENCH hf_export_pipeline ok=true|false tokenizer=CLASS vocab=V eos=ID new_tokens=N
      roundtrip=true|false seconds=S device=D text="..."
ok=false (exit 1) when loading or generating fails or no token is generated; roundtrip says
whether the tokenizer decodes the prompt's ids back to the prompt.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("dir", nargs="?")
    parser.add_argument("--model", help="a Weft model file to export first")
    parser.add_argument("--trainctl", default="trainctl")
    parser.add_argument("--prompt", default="The ")
    parser.add_argument("--new-tokens", type=int, default=20)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    if (args.dir is None) == (args.model is None):
        parser.error("give DIR or --model")
    directory = args.dir
    if args.model:
        directory = os.path.join(tempfile.mkdtemp(prefix="hf_export_"), "hf")
        subprocess.run([args.trainctl, "model", "export", args.model, "--out", directory],
                       check=True)

    fields = {"ok": "false"}
    try:
        import torch
        from transformers import pipeline
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        fields["device"] = device
        start = time.time()
        generator = pipeline("text-generation", model=directory, device=device)
        tok = generator.tokenizer
        fields["tokenizer"] = type(tok).__name__
        fields["vocab"] = len(tok)
        fields["eos"] = tok.eos_token_id
        ids = tok(args.prompt, add_special_tokens=False)["input_ids"]
        fields["roundtrip"] = str(tok.decode(ids) == args.prompt).lower()
        out = generator(args.prompt, max_new_tokens=args.new_tokens, do_sample=False,
                        return_full_text=False)
        text = out[0]["generated_text"]
        new = len(tok(text, add_special_tokens=False)["input_ids"]) if text else 0
        fields["new_tokens"] = new
        fields["seconds"] = f"{time.time() - start:.2f}"
        fields["text"] = json.dumps(text, ensure_ascii=False)
        fields["ok"] = "true" if new > 0 else "false"
    except Exception as e:  # the line must say what failed
        fields["error"] = json.dumps(f"{type(e).__name__}: {e}")
    order = ["ok", "tokenizer", "vocab", "eos", "new_tokens", "roundtrip", "seconds", "device",
             "text", "error"]
    print("BENCH hf_export_pipeline " +
          " ".join(f"{k}={fields[k]}" for k in order if k in fields))
    return 0 if fields["ok"] == "true" else 1


if __name__ == "__main__":
    sys.exit(main())
