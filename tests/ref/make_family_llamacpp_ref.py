#!/usr/bin/env python3
"""make_family_llamacpp_ref.py — llama.cpp's own outputs on GGUF files that `zeroserve convert` wrote
for the newer model families, for tests/test-peer-llamacpp.c (writes tests/ref/llamacpp-family-ref.json,
small; make test reads it, never this script).

The peer is llama.cpp as PyPI's llama-cpp-python==0.3.16 builds it (CPU). For each case:
  1. `zeroserve init-model --arch A --random-norms --seed S --set JSON` writes a random Hugging Face
     checkpoint (every norm and bias random, so that each tensor counts), `zeroserve convert --dtype D
     --name zs-peer` writes the GGUF file (general.name must not contain "phi3": llama.cpp's vocabulary
     loader then looks up "</s>", which a random vocabulary lacks); a checksum of the file is recorded, and
     tests/test-peer-llamacpp.c, which makes the same two files with the library calls, checks it, so
     that both sides run the same bytes;
  2. llama.cpp (n_ctx 512, f32 KV cache) evaluates the case's prompt ids (no tokenizer involved) and
     decodes greedily: the greedy ids and, at each generated position, the 8 largest logits with
     their ids and the logsumexp. Cases marked "dequantized to f32" run llama.cpp on the file with
     every tensor dequantized to F32 (llama.cpp's quantized products round the activations; zeroserve
     then runs its exact f32-activation path on the blocks as stored);
  3. for each feature of the case (RoPE scaling, the sliding window, softcapping, ...) llama.cpp on a
     variant of the file with that feature taken out of the metadata or tensors, teacher-forced over
     the same ids: the largest change of the logits ("delta"). The C test requires every delta to be
     far above its tolerance, so that an engine missing the feature could not pass.
The prompt is 96 ids plus 16 generated: past the sliding windows of 32 (Gemma), YaRN's and Llama 3's
original context of 64 / 32, inside Mistral's window (llama.cpp's llama architecture has none) and
Phi-3's (llama.cpp does not apply Phi-3's window), and inside Phi-3's original context of 512 with
n_ctx 512, where llama.cpp picks the short LongRoPE factors as zeroserve does per position
(llama.cpp chooses once per context: long when n_ctx exceeds the original context).

  python3 -m venv /tmp/lcp && /tmp/lcp/bin/pip install numpy==2.4.6 gguf==0.19.0 llama-cpp-python==0.3.16
  make zeroserve && /tmp/lcp/bin/python tests/ref/make_family_llamacpp_ref.py   # from the repository root
"""
import json, math, os, struct, subprocess, sys, tempfile
import numpy as np
import llama_cpp
import gguf
from gguf import GGUFReader

HERE = os.path.dirname(os.path.abspath(__file__))
ZS = os.environ.get("ZEROSERVE", os.path.join(HERE, "..", "..", "zeroserve"))
TOPK, N_PROMPT, N_NEW, N_CTX = 8, 96, 16, 512


def prompt_ids(seed):
    """N_PROMPT ids in [0, 510] (511 is the random vocabulary's end-of-text) from a 32-bit LCG."""
    x, out = seed, []
    for _ in range(N_PROMPT):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append((x >> 8) % 511)
    return out


def longrope(seed, n):
    x, s, l = seed, [], []
    for i in range(2 * n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        v = ((x >> 8) % 1000) / 1000.0
        (s if i < n else l).append(round(1.0 + 3.0 * v if i < n else 1.0 + 30.0 * v, 3))
    return s, l


SHORT, LONG = longrope(7, 32)  # Phi-3's head_dim 64 / 2
PHI3_SET = {"max_position_embeddings": 2048, "original_max_position_embeddings": 512, "sliding_window": 2047,
            "rope_scaling": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG}}
# name, --arch, --seed, --set, --dtype, peer weights, features: (what, {key: value | None}, [tensors dropped])
CASES = [
    ("llama-llama3", "llama", 11, {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
     "f32", "as stored", [("Llama 3 RoPE (rope_freqs)", {}, ["rope_freqs.weight"])]),
    ("llama-linear", "llama", 12, {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "f32", "as stored",
     [("linear RoPE scaling", {"llama.rope.scaling.type": None, "llama.rope.scaling.factor": None}, [])]),
    ("mistral-yarn", "mistral", 13, {"sliding_window": 1024, "rope_scaling": {
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "mscale": 1.0,
        "mscale_all_dim": 0.5}}, "f32", "as stored",
     [("YaRN", {"llama.rope.scaling.type": None, "llama.rope.scaling.factor": None,
                "llama.rope.scaling.original_context_length": None, "llama.rope.scaling.attn_factor": None}, []),
      ("YaRN attention factor (mscale / mscale_all_dim)", {"llama.rope.scaling.attn_factor": None}, [])]),
    ("qwen2-yarn", "qwen2", 14, {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 64}}, "f32", "as stored",
     [("YaRN", {"qwen2.rope.scaling.type": None, "qwen2.rope.scaling.factor": None,
                "qwen2.rope.scaling.original_context_length": None}, [])]),
    ("qwen3-yarn", "qwen3", 15, {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 64, "attention_factor": 1.3}},
     "f32", "as stored",
     [("YaRN attention_factor", {"qwen3.rope.scaling.attn_factor": None}, [])]),
    ("gemma2", "gemma2", 16, {"sliding_window": 32, "attn_logit_softcapping": 0.1, "final_logit_softcapping": 0.5},
     "f32", "as stored",
     [("sliding window 32", {"gemma2.attention.sliding_window": ("u32", 1024)}, []),
      ("attention logit softcapping", {"gemma2.attn_logit_softcapping": ("f32", 1e6)}, []),
      ("final logit softcapping", {"gemma2.final_logit_softcapping": ("f32", 1e6)}, [])]),
    ("gemma3", "gemma3", 17, {"sliding_window": 32, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
     "f32", "as stored",
     [("sliding window 32", {"gemma3.attention.sliding_window": ("u32", 1024)}, []),
      ("linear RoPE scaling of the global layers", {"gemma3.rope.scaling.type": None,
                                                    "gemma3.rope.scaling.factor": None}, []),
      ("global RoPE base 1e6 (local 10000)", {"gemma3.rope.freq_base": ("f32", 10000.0)}, [])]),
    ("gemma3-q4_k_m", "gemma3", 17, {"sliding_window": 32, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
     "q4_k_m", "dequantized to f32", []),
    ("phi3-longrope", "phi3", 18, PHI3_SET, "f32", "as stored",
     [("LongRoPE short factors and attention factor", {"phi3.rope.scaling.attn_factor": None},
       ["rope_factors_long.weight", "rope_factors_short.weight"]),
      ("LongRoPE attention factor", {"phi3.rope.scaling.attn_factor": ("f32", 1.0)}, [])]),
    ("phi3-q8_0", "phi3", 18, PHI3_SET, "q8_0", "dequantized to f32", []),
]


def checksum(path):
    """sum over the file's little-endian 64-bit words w[i] (zero-padded) of w[i] * (2i + 1), mod 2^64:
    a fingerprint of the bytes (any single change alters it) that numpy computes at once."""
    data = open(path, "rb").read()
    data += b"\0" * (-len(data) % 8)
    w = np.frombuffer(data, dtype="<u8")
    k = np.arange(w.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    with np.errstate(over="ignore"):
        return "%016x" % int(np.sum(w * k, dtype=np.uint64))


def kv_bytes(key, typ, val):
    k = key.encode()
    b = struct.pack("<Q", len(k)) + k
    if typ == "f32":
        return b + struct.pack("<If", 6, float(val))
    if typ == "u32":
        return b + struct.pack("<II", 4, int(val))
    raise SystemExit("kv type " + typ)


def rewrite(src, dst, keys=None, drop=(), dequant=False):
    """src with keys set ((type, value)) or removed (None), tensors in drop left out, every tensor
    dequantized to F32 if dequant; key/values copied as serialized (gguf.GGUFWriter refuses the empty
    merges array of a byte-level vocabulary)."""
    keys = keys or {}
    r = GGUFReader(src)
    kvs = [b"".join(np.asarray(p).tobytes() for p in f.parts) for k, f in r.fields.items()
           if not k.startswith("GGUF.") and k not in keys and not (dequant and k == "general.file_type")]
    kvs += [kv_bytes(k, *v) for k, v in keys.items() if v is not None]
    if dequant:
        kvs.append(kv_bytes("general.file_type", "u32", 0))
    align = int(r.fields["general.alignment"].contents()) if "general.alignment" in r.fields else 32
    tensors = [t for t in r.tensors if t.name not in drop]
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for b in kvs:
        out += b
    datas, off = [], 0
    for t in tensors:
        if dequant:
            a = np.ascontiguousarray(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), dtype="<f4").tobytes()
            ty = 0
        else:
            a, ty = np.asarray(t.data).tobytes(), int(t.tensor_type)
        name = t.name.encode()
        out += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(t.shape))
        out += b"".join(struct.pack("<Q", int(x)) for x in t.shape) + struct.pack("<IQ", ty, off)
        datas.append(a)
        off += (len(a) + align - 1) // align * align
    out += b"\0" * (-len(out) % align)
    for a in datas:
        out += a + b"\0" * (-len(a) % align)
    open(dst, "wb").write(out)


def llm_open(path):
    return llama_cpp.Llama(model_path=path, n_ctx=N_CTX, n_batch=N_CTX, logits_all=True, n_threads=2, seed=0,
                           verbose=False, type_k=0, type_v=0)  # f32 KV cache, as zeroserve's default


def greedy(path, prompt):
    llm = llm_open(path)
    llm.eval(prompt)
    ids, steps, rows = [], [], []
    eos = llm.token_eos()
    for _ in range(N_NEW):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        top = np.argsort(-row, kind="stable")[:TOPK]
        m = row.max()
        steps.append({"top_ids": [int(i) for i in top], "top_logits": [round(float(row[i]), 6) for i in top],
                      "logsumexp": round(float(m + math.log(np.exp(row - m).sum())), 6)})
        rows.append(row)
        nxt = int(top[0])
        ids.append(nxt)
        if nxt == eos:
            break
        llm.eval([nxt])
    del llm
    return ids, steps, np.array(rows)


def forced(path, prompt, ids):
    """The logits rows at the generated positions of a teacher-forced pass over prompt + ids."""
    llm = llm_open(path)
    llm.eval(prompt + ids[:-1])
    rows = np.array([llm.scores[len(prompt) - 1 + i] for i in range(len(ids))], dtype=np.float64)
    del llm
    return rows


def main():
    if not os.path.exists(ZS):
        raise SystemExit(f"{ZS}: not found (make zeroserve, or set ZEROSERVE)")
    tmp = tempfile.mkdtemp(prefix="zs-family-ref-")
    ref = {"peer": f"llama.cpp via llama-cpp-python=={llama_cpp.__version__}", "topk": TOPK, "n_ctx": N_CTX,
           "cases": []}
    for name, arch, seed, sets, dtype, peer, feats in CASES:
        d = os.path.join(tmp, name)
        path = os.path.join(tmp, name + ".gguf")
        subprocess.run([ZS, "init-model", "--arch", arch, "--random-norms", "--seed", str(seed), "--set",
                        json.dumps(sets), "--out", d], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([ZS, "convert", "--model", d, "--out", path, "--dtype", dtype, "--name", "zs-peer"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run_path = path
        if peer == "dequantized to f32":
            run_path = os.path.join(tmp, name + "-f32.gguf")
            rewrite(path, run_path, dequant=True)
        prompt = prompt_ids(seed)
        ids, steps, rows = greedy(run_path, prompt)
        case = {"name": name, "arch": arch, "seed": seed, "set": sets, "dtype": dtype, "peer_weights": peer,
                "gguf_checksum": checksum(path), "prompt_ids": prompt, "ids": ids, "steps": steps, "features": []}
        base = forced(run_path, prompt, ids)
        for what, keys, drop in feats:
            v = os.path.join(tmp, name + "-variant.gguf")
            rewrite(run_path, v, keys=keys, drop=drop)
            delta = float(np.abs(forced(v, prompt, ids) - base).max())
            case["features"].append({"what": what, "delta": round(delta, 6)})
        ref["cases"].append(case)
        print("%-14s %s ids %s; features: %s" % (name, arch, ids, ", ".join(
            "%s %.3g" % (f["what"], f["delta"]) for f in case["features"]) or "-"), file=sys.stderr)
    out = os.path.join(HERE, "llamacpp-family-ref.json")
    with open(out, "w") as f:
        json.dump(ref, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print("wrote", out, file=sys.stderr)


if __name__ == "__main__":
    main()
