#!/usr/bin/env python3
"""make_q8_ref.py — the Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 reference vectors of tests/test-quant.c.

Writes tests/ref/q8_0-ref.bin: b"ZSQ8", uint32 n_blocks (little-endian), then n_blocks*32 float32
inputs, then the n_blocks*34 bytes that the `gguf` package's quantizer (gguf.quants.quantize with
GGMLQuantizationType.Q8_0, bit-exact with ggml's quantize_row_q8_0_ref) makes of them; and
tests/ref/q4_0-ref.bin, the same with b"ZSQ4" and the n_blocks*18 bytes of Q4_0
(quantize_row_q4_0_ref); and tests/ref/q4_1-ref.bin, q5_0-ref.bin, q5_1-ref.bin (b"ZS41", b"ZS50",
b"ZS51"; 20-, 22- and 24-byte blocks), which after the bytes also hold the n_blocks*32 float32
values the package's dequantizer (gguf.quants.dequantize, ggml's dequantize_row_*: Q4_1/Q5_1
(d*q) + m with two roundings) makes of those bytes. The inputs
are random normal blocks at many scales plus edge cases: an all-zero block, a block of exact
rounding ties, values whose scale is an f16 subnormal, values near the f16 range, one-hot blocks.

tests/ref/q4_k-ref.bin, q6_k-ref.bin, q5_k-ref.bin, q3_k-ref.bin and q2_k-ref.bin (b"ZS4K", b"ZS6K",
b"ZS5K", b"ZS3K", b"ZS2K"; the package has no K-quant quantizer): uint32 n_blocks, then n_blocks
random super-blocks (144 / 210 / 176 / 110 / 84 bytes: random bytes, with the f16 d and dmin
replaced by finite values at several scales, some zero or negative), then the n_blocks*256 float32
values gguf.quants.dequantize (ggml's dequantize_row_q4_K/q6_K/q5_K/q3_K/q2_K) makes of them.

(Regenerating on another machine can change the last bit of a few inputs of the 32-blocks' files,
whose last block is x**3 through numpy's vectorised pow; the K-quant files do not depend on it.)

Needs numpy and gguf from PyPI (only to regenerate the file; make test reads the .bin):
  python3 -m venv /tmp/qv && /tmp/qv/bin/pip install gguf==0.19.0 numpy==2.4.6
  /tmp/qv/bin/python tests/ref/make_q8_ref.py          # from the repository root
"""
import os, struct
import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize, dequantize

HERE = os.path.dirname(os.path.abspath(__file__))


def blocks():
    rng = np.random.default_rng(20261201)
    out = []
    for scale in [1e-6, 1e-3, 0.02, 0.5, 1.0, 3.0, 100.0, 1000.0]:
        for _ in range(6):
            out.append(rng.standard_normal(32).astype(np.float32) * np.float32(scale))
    out.append(np.zeros(32, np.float32))                                  # d = 0: id = 0
    out.append((np.arange(32, dtype=np.float32) - 16) + np.float32(0.5))  # ties after scaling
    t = np.full(32, 0.5, np.float32); t[0] = 127.0; t[1] = -127.0; t[2] = 1.5; t[3] = -2.5
    out.append(t)                                                         # d = 1: exact .5 ties
    out.append(rng.standard_normal(32).astype(np.float32) * np.float32(1e-7))  # subnormal f16 d
    out.append(rng.uniform(-60000, 60000, 32).astype(np.float32))        # d near 472
    oh = np.zeros(32, np.float32); oh[7] = -3.25
    out.append(oh)                                                        # one-hot, negative max
    out.append(np.linspace(-1, 1, 32, dtype=np.float32))
    out.append(rng.uniform(-1, 1, 32).astype(np.float32) ** 3)
    return np.stack(out).astype(np.float32)


def main():
    x = blocks()
    for name, magic, qt, bb in [('q8_0', b'ZSQ8', GGMLQuantizationType.Q8_0, 34),
                                ('q4_0', b'ZSQ4', GGMLQuantizationType.Q4_0, 18),
                                ('q4_1', b'ZS41', GGMLQuantizationType.Q4_1, 20),
                                ('q5_0', b'ZS50', GGMLQuantizationType.Q5_0, 22),
                                ('q5_1', b'ZS51', GGMLQuantizationType.Q5_1, 24)]:
        q = quantize(x.reshape(-1), qt)
        q = np.asarray(q, dtype=np.uint8).reshape(-1)
        assert q.size == x.shape[0] * bb, q.size
        with open(os.path.join(HERE, name + '-ref.bin'), 'wb') as f:
            f.write(magic + struct.pack('<I', x.shape[0]))
            f.write(x.astype('<f4').tobytes())
            f.write(q.tobytes())
            if bb in (20, 22, 24):
                y = np.asarray(dequantize(q, qt), dtype=np.float32).reshape(-1)
                assert y.size == x.size, y.size
                f.write(y.astype('<f4').tobytes())
        print('%s: wrote %d blocks' % (name, x.shape[0]))


def kquants():
    rng = np.random.default_rng(20261202)
    for name, magic, qt, bb, doff in [('q4_k', b'ZS4K', GGMLQuantizationType.Q4_K, 144, [0, 2]),
                                      ('q6_k', b'ZS6K', GGMLQuantizationType.Q6_K, 210, [208]),
                                      ('q5_k', b'ZS5K', GGMLQuantizationType.Q5_K, 176, [0, 2]),
                                      ('q3_k', b'ZS3K', GGMLQuantizationType.Q3_K, 110, [108]),
                                      ('q2_k', b'ZS2K', GGMLQuantizationType.Q2_K, 84, [80, 82])]:
        nb = 24
        q = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
        for b in range(nb):
            for o in doff:
                v = np.float16(rng.standard_normal() * [1e-4, 1e-2, 0.1, 1.0, 30.0, 0.0][b % 6])
                if b == 7: v = np.float16(-0.0)
                if b == 9: v = np.float16(6e-8)   # an f16 subnormal
                q[b, o:o + 2] = np.frombuffer(v.tobytes(), np.uint8)
        y = np.asarray(dequantize(q.reshape(-1), qt), dtype=np.float32).reshape(-1)
        assert y.size == nb * 256 and np.all(np.isfinite(y)), y.size
        with open(os.path.join(HERE, name + '-ref.bin'), 'wb') as f:
            f.write(magic + struct.pack('<I', nb))
            f.write(q.tobytes())
            f.write(y.astype('<f4').tobytes())
        print('%s: wrote %d super-blocks' % (name, nb))


if __name__ == '__main__':
    main()
    kquants()
