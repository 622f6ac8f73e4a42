#!/usr/bin/python3
"""What a Weft model file (the model.safetensors a job writes) says: the job spec it was
trained under and the tokenizer of its data. Standard library only.

    weft_model.py MODEL.safetensors                          # JSON: format, tokenizer, spec
    weft_model.py MODEL.safetensors --tokenizer-out tok.model   # the SentencePiece model

The tokenizer is in the file's metadata (worker/model_io/model_file.h): "weft.tokenizer.kind" ("bytes" or
"sentencepiece"; absent: none recorded, the model speaks token ids) and, for SentencePiece,
"weft.tokenizer.model" (the .model file, base64) and "weft.tokenizer.crc32c", which this script
checks. The .model it writes loads in any SentencePiece (the `sentencepiece` package's
SentencePieceProcessor(model_file=...), spm_decode, transformers' LlamaTokenizer).

Text from the model itself: `trainctl sample JOB --prompt "..."` runs it on Weft's CPU engine
and encodes and decodes with this tokenizer; or `trainctl model export` it to a Hugging Face
directory for transformers.

Exit status: 0, or 1 with "weft_model: FILE: what is wrong" on stderr.
"""
import argparse
import base64
import binascii
import json
import os
import struct
import sys


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C_TABLE = _crc32c_table()


def crc32c(data):
    """CRC32C (Castagnoli), the checksum Weft writes as "0x" and 8 hex digits."""
    c = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


class ModelFileError(Exception):
    pass


def read_metadata(path):
    """The safetensors header's "__metadata__" (a dict of strings)."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise ModelFileError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (size,) = struct.unpack("<Q", prefix)
        if size > os.fstat(f.fileno()).st_size - 8:
            raise ModelFileError(f"{path}: not a safetensors file (header length {size} is past "
                                 "the end of the file)")
        header = f.read(size)
    try:
        return json.loads(header).get("__metadata__", {})
    except (ValueError, AttributeError) as e:
        raise ModelFileError(f"{path}: not a safetensors file ({e})")


def tokenizer_of(path, metadata):
    """(kind, model bytes or None, "0x..." or None); kind None when none is recorded."""
    kind = metadata.get("weft.tokenizer.kind")
    if kind is None or kind == "bytes":
        return kind, None, None
    if kind != "sentencepiece":
        raise ModelFileError(f"{path}: weft.tokenizer.kind is {kind!r}, not bytes or sentencepiece")
    try:
        model = base64.b64decode(metadata["weft.tokenizer.model"], validate=True)
        expected = metadata["weft.tokenizer.crc32c"]
    except KeyError as e:
        raise ModelFileError(f"{path}: metadata {e.args[0]} is missing")
    except binascii.Error:
        raise ModelFileError(f"{path}: metadata weft.tokenizer.model is not base64")
    actual = f"0x{crc32c(model):08x}"
    if actual != expected:
        raise ModelFileError(
            f"{path}: weft.tokenizer.model has crc32c {actual}, but weft.tokenizer.crc32c says "
            f"{expected}")
    return kind, model, actual


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a Weft model file (model.safetensors)")
    parser.add_argument("--tokenizer-out", help="write the SentencePiece model here")
    args = parser.parse_args(argv)
    try:
        metadata = read_metadata(args.model)
        if "weft.job_spec" not in metadata:
            raise ModelFileError(f"{args.model}: no weft.job_spec metadata: not a Weft model")
        kind, model, crc = tokenizer_of(args.model, metadata)
        if args.tokenizer_out:
            if model is None:
                raise ModelFileError(
                    f"{args.model}: no SentencePiece tokenizer to write (tokenizer: {kind})")
            with open(args.tokenizer_out, "wb") as f:
                f.write(model)
        print(json.dumps({"path": args.model, "format": metadata.get("format"),
                          "tokenizer": {"kind": kind, "crc32c": crc,
                                        "bytes": len(model) if model is not None else None},
                          "job_spec": metadata["weft.job_spec"]}, indent=2))
        return 0
    except (OSError, ModelFileError) as e:
        print(f"weft_model: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
