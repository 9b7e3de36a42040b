#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets into tests/fuzz/corpus/<target>/ (committed; rerun after
changing this script). Deterministic: the same bytes on every run.

fuzz_idx          first byte: the rank the reader is asked for; then an IDX file, plain or gzip, valid or not
fuzz_safetensors  safetensors files, valid (every dtype, metadata, escapes, empty tensors) and not
fuzz_graph        random bytes (the target decodes any byte string into a graph)
"""
import gzip
import json
import random
import struct
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"


def write(target, name, data):
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def idx(dims, payload, element_type=0x08):
    header = bytes([0, 0, element_type, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims)
    return header + bytes(payload)


def idx_corpus():
    labels = idx([5], [0, 1, 2, 9, 4])
    images = idx([2, 3, 3], range(18))
    write("fuzz_idx", "labels_rank1", b"\x01" + labels)
    write("fuzz_idx", "images_rank3", b"\x03" + images)
    write("fuzz_idx", "images_rank3_gzip", b"\x03" + gzip.compress(images, mtime=0))
    write("fuzz_idx", "truncated_payload", b"\x03" + images[:-5])
    write("fuzz_idx", "trailing_bytes", b"\x02" + idx([2, 2], [1, 2, 3, 4]) + b"\x00\x00")
    write("fuzz_idx", "wrong_element_type", b"\x01" + idx([3], [1, 2, 3], element_type=0x0D))
    write("fuzz_idx", "huge_dims", b"\x03" + idx([60000, 60000, 784], []))
    write("fuzz_idx", "gigabyte_announced", b"\x03" + idx([1000, 1000, 1000], range(7)))
    write("fuzz_idx", "cut_gzip", b"\x01" + gzip.compress(labels, mtime=0)[:-6])


def safetensors(tensors, metadata=None, pad=True):
    """tensors: name -> (dtype, shape, raw bytes); laid out in the given order."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_corpus():
    f32 = struct.pack("<6f", 1.0, -2.0, 0.5, 3.25, 0.0, -0.0)
    f64 = struct.pack("<2d", 1e300, -1e-300)
    i64 = struct.pack("<3q", 0, -1, 2**62)
    write("fuzz_safetensors", "one_f32", safetensors({"w": ("F32", [2, 3], f32)}))
    write("fuzz_safetensors", "every_dtype",
          safetensors({"b": ("F64", [2], f64), "c": ("I64", [3], i64), "a": ("F32", [6], f32)},
                      metadata={"format": "pt", "step": "10"}))
    write("fuzz_safetensors", "empty_and_scalar",
          safetensors({"e": ("F32", [0, 4], b""), "s": ("F64", [], struct.pack("<d", 2.5))}))
    write("fuzz_safetensors", "no_tensors", safetensors({}))
    write("fuzz_safetensors", "escaped_name", safetensors({"caf\u00e9 \"q\"\n": ("F32", [1], f32[:4])}))
    write("fuzz_safetensors", "unpadded", safetensors({"w": ("F32", [1, 1], f32[:4])}, pad=False))
    bad = safetensors({"w": ("F32", [2, 3], f32)})
    write("fuzz_safetensors", "truncated_data", bad[:-3])
    write("fuzz_safetensors", "bad_length", struct.pack("<Q", 2**40) + bad[8:])
    overlap = (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
               b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}')
    write("fuzz_safetensors", "overlapping", struct.pack("<Q", len(overlap)) + overlap + bytes(12))


def graph_corpus():
    rng = random.Random(20261121)
    for i in range(24):
        write("fuzz_graph", f"random_{i:02d}", bytes(rng.randrange(256) for _ in range(48)))
    # Found by fuzz_graph: max_pool2d of a (N,C,0,W) input with padding read outside the input (fixed in
    # infer::pool2d, which now rejects it).
    write("fuzz_graph", "max_pool_empty_plane",
          bytes.fromhex("9af995282aea6b30877f888888888888888888888888888888"
                        "88b8ef4a74ffffffffffffff313c8089c2bf4aca3c80b5"))


if __name__ == "__main__":
    idx_corpus()
    safetensors_corpus()
    graph_corpus()
