#!/usr/bin/env python3
"""make_qk_ref.py — the K-quant quantizer reference of tests/test-quant-k.c: Q4_K, Q6_K, Q5_K, Q3_K
and Q2_K.

Writes tests/ref/qk-quant-ref.bin (little-endian throughout):
  b"ZSQK", uint32 n_rows, uint32 n_rows row lengths (256 or 512; nb = their sum / 256 super-blocks),
  the nb*256 float32 inputs (the rows one after another),
  uint32 n_types, the n_types ggml type ids (GGML_TYPE_Q4_K = 12, Q6_K = 14, Q5_K = 13, Q3_K = 11,
  Q2_K = 10, in that order), then per type the nb*bytes of its super-blocks (144, 210, 176, 110,
  84 bytes) and the nb*256 float32 values ggml dequantizes them to.
The bytes are ggml's own: ggml_quantize_chunk (no importance matrix, so quantize_row_q4_K_ref /
q6_K_ref / q5_K_ref / q3_K_ref / q2_K_ref) from libggml-base, one call per row, and the values its
dequantize_row_q4_K / q6_K / q5_K / q3_K / q2_K, called through ctypes.
The rows are deterministic: random normal at several scales, rows with outliers, zeros, tiny
values (an f16-subnormal and an underflowing d), all-positive and constant rows, groups of very
different size in one super-block, exact ties, one-hot rows.
Then a section for many more super-blocks than the file could hold: b"ZSQH", uint32 seed, uint32
nb2, and two uint64 FNV-1a hashes per type (in the order above): of its bytes and of their
dequantized float32 values, for nb2 super-blocks of generated inputs that the C test makes again bit
for bit (gen_hashed below: integers from a counter hash (lowbias32) scaled by powers of two, so
every value is exact in f32; per super-block and per 16 a random exponent, some zero groups, some
outliers).

Needs numpy and llama-cpp-python (for its bundled libggml-base; only to regenerate the file,
make test reads the .bin):
  python3 -m venv /tmp/lcp && /tmp/lcp/bin/pip install numpy==2.4.6 llama-cpp-python==0.3.36
  /tmp/lcp/bin/python tests/ref/make_qk_ref.py          # from the repository root
"""
import ctypes, glob, os, struct
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# (ggml type id, bytes per super-block, dequantizer name) in the file's order
TYPES = [(12, 144, 'dequantize_row_q4_K'), (14, 210, 'dequantize_row_q6_K'), (13, 176, 'dequantize_row_q5_K'),
         (11, 110, 'dequantize_row_q3_K'), (10, 84, 'dequantize_row_q2_K')]


def load_ggml():
    import llama_cpp
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), 'lib')
    paths = glob.glob(os.path.join(libdir, 'libggml-base.so*'))
    if not paths:
        raise SystemExit('libggml-base not found under %s' % libdir)
    g = ctypes.CDLL(paths[0])
    g.ggml_quantize_chunk.restype = ctypes.c_size_t
    g.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    for _, _, name in TYPES:
        fn = getattr(g, name)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return g


def rows():
    rng = np.random.default_rng(20261203)
    f = np.float32
    out = []
    nrm = lambda n, s: rng.standard_normal(n).astype(f) * f(s)
    out.append(nrm(256, 0.02))                       # a typical weight row
    out.append(nrm(512, 1.0))                        # two super-blocks
    r = nrm(512, 0.05); r[[3, 77, 300, 301, 480]] *= f(60.0)
    out.append(r)                                    # outliers
    out.append(np.zeros(256, f))                     # all zero: d = dmin = 0
    out.append(nrm(256, 1e-6))                       # d an f16 subnormal
    out.append(nrm(256, 1e-9))                       # d underflows f16 to 0
    out.append(rng.uniform(0.1, 2.0, 256).astype(f))  # all positive: the min clamps to 0
    out.append(np.full(256, -0.75, f))               # constant negative: max == min
    r = nrm(256, 0.3); r[64:96] = 0; r[200:216] = 0
    out.append(r)                                    # zero groups (of 32 and of 16) in a block
    r = nrm(256, 1e-4); r[:32] = nrm(32, 10.0)
    out.append(r)                                    # groups whose 6-bit scale rounds to 0
    out.append(nrm(256, 1000.0))                     # large values
    out.append((np.arange(256, dtype=f) % 16 - 7.5).astype(f))  # exact ties after scaling
    r = np.zeros(256, f); r[5] = f(-3.25); r[130] = f(0.5)
    out.append(r)                                    # sparse
    out.append((rng.uniform(-1, 1, 256) ** 3).astype(f))        # heavy centre
    r = nrm(256, 0.01); r[::17] = f(-0.9)
    out.append(r)                                    # a negative outlier in every group
    return out


def lowbias32(x):
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7feb352d)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846ca68b)
    x ^= x >> np.uint32(16)
    return x


def gen_hashed(seed, nb):
    """value i of super-block b, group of 16 j: s * 2^(eb + eg - 20) (x32 for an outlier, 0 in a zero
    group) with s = the sum of three 21-bit draws minus 3*2^20, eb in [-30, 9], eg in [-4, 3]"""
    n = nb * 256
    u = lambda k: lowbias32(np.asarray(k, np.uint64).astype(np.uint32) + np.uint32(seed * 0x9E3779B9 % 2**32))
    i = np.arange(n, dtype=np.uint64)
    s = ((u(3 * i) >> 11).astype(np.int64) + (u(3 * i + 1) >> 11) + (u(3 * i + 2) >> 11) - 3 * 2**20)
    j = i // 16
    c = u(0x40000000 + j)
    eb = (u(0x50000000 + i // 256) % 40).astype(np.int64) - 30
    eg = (c % 8).astype(np.int64) - 4
    s = np.where(c % 37 == 0, 0, s)
    s = np.where(u(0x60000000 + i) % 97 == 0, s * 32, s)
    return np.ldexp(s.astype(np.float32), (eb + eg - 20).astype(np.int32)).astype('<f4')


def fnv1a64(b):
    h = 0xcbf29ce484222325
    for byte in memoryview(b).cast('B'):  # sequential; a few MB take a few seconds
        h = ((h ^ byte) * 0x100000001b3) & 0xffffffffffffffff
    return h


def quantize(g, qt, bb, x, n_per_row):
    q = np.zeros(x.size // 256 * bb, np.uint8)
    got = g.ggml_quantize_chunk(qt, x.ctypes.data, q.ctypes.data, 0, x.size // n_per_row, n_per_row, None)
    assert got == q.size, (got, q.size)
    return q


def main():
    g = load_ggml()
    rs = rows()
    x = np.ascontiguousarray(np.concatenate(rs).astype('<f4'))
    nb = x.size // 256
    res = []
    for qt, bb, dname in TYPES:
        deq = getattr(g, dname)
        q = np.zeros(nb * bb, np.uint8)
        off_x = off_q = 0
        for r in rs:  # one call per row
            qr = quantize(g, qt, bb, np.ascontiguousarray(x[off_x:off_x + r.size]), r.size)
            q[off_q:off_q + qr.size] = qr
            off_x += r.size
            off_q += qr.size
        y = np.zeros(nb * 256, '<f4')
        deq(q.ctypes.data, y.ctypes.data, nb * 256)
        assert np.all(np.isfinite(y))
        res.append((q, y))
    path = os.path.join(HERE, 'qk-quant-ref.bin')
    with open(path, 'wb') as f:
        f.write(b'ZSQK' + struct.pack('<I', len(rs)) + struct.pack('<%dI' % len(rs), *[r.size for r in rs]))
        f.write(x.tobytes())
        f.write(struct.pack('<I', len(TYPES)) + struct.pack('<%dI' % len(TYPES), *[t[0] for t in TYPES]))
        for q, y in res:
            f.write(q.tobytes())
            f.write(y.tobytes())
        seed, nb2 = 7, 2048
        xh = np.ascontiguousarray(gen_hashed(seed, nb2))
        assert np.all(np.isfinite(xh))
        hs = []
        for qt, bb, dname in TYPES:
            deq = getattr(g, dname)
            q = quantize(g, qt, bb, xh, 1024)
            y = np.zeros(xh.size, '<f4')
            deq(q.ctypes.data, y.ctypes.data, xh.size)
            hs += [fnv1a64(q.tobytes()), fnv1a64(y.tobytes())]
        f.write(b'ZSQH' + struct.pack('<II', seed, nb2) + struct.pack('<%dQ' % len(hs), *hs))
        print('hashed: seed %d, %d super-blocks, input FNV %016x, hashes %s' %
              (seed, nb2, fnv1a64(xh.tobytes()), ' '.join('%016x' % h for h in hs)))
    print('%s: %d rows, %d super-blocks, %d bytes' % (path, len(rs), nb, os.path.getsize(path)))


if __name__ == '__main__':
    main()
