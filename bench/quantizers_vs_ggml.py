"""Reconstruction error of ops.quantize against ggml's own quantizers (and against the numpy transcription of
ggml's reference algorithms the tests use, tests/ggml_reference_quantizers.py), per type and data
distribution, without and with an importance matrix. Prints a markdown table of NMSE = sum(w*(y-x)^2) /
sum(w*x^2) over all rows (w = the importance matrix's column weight in the imatrix columns, else 1); "ours,
none" is the quantizer run without the matrix and scored with it.

ggml is not a dependency: pass a built libggml-base.so (any llama.cpp / ggml build) with --ggml-lib; its
ggml_quantize_chunk(type, src, dst, start, nrows, n_per_row, imatrix) is called through ctypes. Local only:
the tests compare against the numpy transcription instead."""

import argparse
import ctypes
import os
import sys

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType, quants

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import ggml_reference_quantizers as ggml_ref  # noqa: E402

from mlx_ggml_ext import GGMLType, ops  # noqa: E402

TYPES = ["Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "Q4_K", "Q5_K", "Q6_K"]


def data(rng, rows, k):
    normal = rng.standard_normal((rows, k))
    heavy = rng.standard_t(3, (rows, k))
    heavy[rng.random((rows, k)) < 0.005] *= 20
    return {"normal": normal, "heavy_tailed": heavy, "positive": rng.uniform(0, 1, (rows, k)),
            "row_scales": normal * np.logspace(-3, 3, rows)[:, None]}


def ggml_quantize(lib, t: GGMLType, x: np.ndarray, imatrix):
    out = np.zeros((x.shape[0], t.row_bytes(x.shape[1])), np.uint8)
    im = None if imatrix is None else imatrix.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    lib.ggml_quantize_chunk(int(t), x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.ctypes.data_as(ctypes.c_void_p),
                            0, x.shape[0], x.shape[1], im)
    return quants.dequantize(out, GGMLQuantizationType(int(t)))


def nmse(y, x, w):
    d = (y.astype(np.float64) - x) ** 2 * w
    return float(d.sum() / (x.astype(np.float64) ** 2 * w).sum())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ggml-lib", required=True, help="path of libggml-base.so")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--k", type=int, default=4096)
    args = p.parse_args()
    lib = ctypes.CDLL(args.ggml_lib)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_float)]
    rng = np.random.default_rng(1)
    sets = {name: x.astype(np.float32) for name, x in data(rng, args.rows, args.k).items()}
    imatrix = np.exp(1.5 * rng.standard_normal(args.k)).astype(np.float32)
    print("| type | data | ours | numpy ref | ggml | ours, imatrix | ours, none | numpy ref, imatrix | ggml, imatrix |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in TYPES:
        t = GGMLType[name]
        for dname, x in sets.items():
            plain, weighted = [], []
            for im in (None, imatrix):
                ours = quants.dequantize(np.array(ops.quantize(mx.array(x), t, imatrix=None if im is None else
                                                               mx.array(im), stream=mx.cpu)),
                                         GGMLQuantizationType(int(t)))
                theirs = ggml_quantize(lib, t, x, im)
                ref = ggml_ref.QUANTIZERS[name](x, im) if name in ggml_ref.QUANTIZERS else None
                w = np.ones(args.k) if im is None else im.astype(np.float64)
                cells = plain if im is None else weighted
                cells.append(nmse(ours, x, w))
                if im is not None:
                    cells.append(nmse(plain_ours, x, w))  # the quantizer without the matrix, scored with it
                cells.append(None if ref is None else nmse(ref, x, w))
                cells.append(nmse(theirs, x, w))
                plain_ours = ours
            print(f"| {name} | {dname} | " + " | ".join("-" if c is None else f"{c:.6f}" for c in plain + weighted)
                  + " |", flush=True)

if __name__ == "__main__":
    main()
