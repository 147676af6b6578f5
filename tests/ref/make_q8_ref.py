#!/usr/bin/env python3
"""make_q8_ref.py — the Q8_0 and Q4_0 reference vectors of tests/test-quant.c.

Writes tests/ref/q8_0-ref.bin: b"ZSQ8", uint32 n_blocks (little-endian), then n_blocks*32 float32
inputs, then the n_blocks*34 bytes that the `gguf` package's quantizer (gguf.quants.quantize with
GGMLQuantizationType.Q8_0, bit-exact with ggml's quantize_row_q8_0_ref) makes of them; and
tests/ref/q4_0-ref.bin, the same with b"ZSQ4" and the n_blocks*18 bytes of Q4_0
(quantize_row_q4_0_ref). The inputs
are random normal blocks at many scales plus edge cases: an all-zero block, a block of exact
rounding ties, values whose scale is an f16 subnormal, values near the f16 range, one-hot blocks.

Needs numpy and gguf from PyPI (only to regenerate the file; make test reads the .bin):
  python3 -m venv /tmp/qv && /tmp/qv/bin/pip install gguf==0.19.0 numpy==2.4.6
  /tmp/qv/bin/python tests/ref/make_q8_ref.py          # from the repository root
"""
import os, struct
import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize

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
                                ('q4_0', b'ZSQ4', GGMLQuantizationType.Q4_0, 18)]:
        q = quantize(x.reshape(-1), qt)
        q = np.asarray(q, dtype=np.uint8).reshape(-1)
        assert q.size == x.shape[0] * bb, q.size
        with open(os.path.join(HERE, name + '-ref.bin'), 'wb') as f:
            f.write(magic + struct.pack('<I', x.shape[0]))
            f.write(x.astype('<f4').tobytes())
            f.write(q.tobytes())
        print('%s: wrote %d blocks' % (name, x.shape[0]))


if __name__ == '__main__':
    main()
