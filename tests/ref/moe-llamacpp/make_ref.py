#!/usr/bin/env python3
"""make_ref.py — llama.cpp's own outputs on the mixture-of-experts GGUF files that `zeroserve convert`
writes (Mixtral as llama with experts, Qwen2-MoE, Qwen3-MoE, OLMoE), for tests/test-moe-gguf.c
(writes tests/ref/moe-llamacpp/ref.json, about 80 KB; make test reads it, never this script).

The peer is llama.cpp as PyPI's llama-cpp-python==0.3.16 builds it (CPU). For each case:
  1. `zeroserve init-model --arch A --random-norms --init-std 0.1 --seed S --set JSON` writes a random
     Hugging Face checkpoint (norms and biases random too; matrices at 5x the default spread, so that
     greedy decoding does not settle on one id and routing is decisive), `zeroserve convert --dtype D
     --name zs-peer` writes the GGUF file; its checksum is recorded, and tests/test-moe-gguf.c, which
     makes the same two files with the library calls, checks it, so that both sides run the same bytes;
  2. llama.cpp (n_ctx 512, f32 KV cache) evaluates the case's prompt ids (no tokenizer involved) and
     decodes greedily: the greedy ids, the whole logits row of the prompt's last position, and at each
     generated position the 8 largest logits with their ids and the logsumexp. The quantized cases
     ("dequantized to f32") run llama.cpp on the file with every tensor dequantized to F32 (llama.cpp's
     quantized products round the activations; zeroserve then runs its exact f32-activation path on the
     blocks as stored);
  3. on the f32 cases, for each feature (top-k routing itself: expert_used_count 1 and all experts;
     Qwen2-MoE's shared expert; the q/k norms of Qwen3-MoE and OLMoE) llama.cpp on a variant of the
     file with that feature changed, teacher-forced over the same ids: the largest change of the logits
     ("delta"). The C test requires every delta to be far above its tolerance, so that an engine that
     routed differently (or skipped the feature) could not pass.
All four architectures load and run in llama.cpp 0.3.16. Before writing, the files are also checked
against llama.cpp's own tools (any unexplained difference stops the script):
  - the q4_k_m files against llama-quantize itself (llama_cpp.llama_model_quantize on zeroserve's f32
    conversion of the same checkpoint): every tensor byte for byte and every key but general.* and
    tokenizer.* (with llama-cpp-python 0.3.36 there is no substitution left: 8 experts' attn_output is
    Q5_K on both sides; 0.3.16's run allowed Q6_K there, before zeroserve had Q5_K);
  - with a Python that has torch and transformers (--transformers-python, default /tmp/tv/bin/python
    when it exists; --no-transformers skips these): the f32 and q8_0 files against llama.cpp's own
    convert_hf_to_gguf.py on the same checkpoint (tests/ref/check_convert.py's runner, vocabulary left
    out: every key but general.* and tokenizer.*, every tensor byte for byte), and llama.cpp's logits of
    the prompt's last position on each f32 file against transformers' on the checkpoint (|diff| <= 1e-4).

  python3 -m venv /tmp/lcp && /tmp/lcp/bin/pip install numpy==2.4.6 gguf==0.19.0 llama-cpp-python==0.3.16
  make zeroserve && /tmp/lcp/bin/python tests/ref/moe-llamacpp/make_ref.py   # from the repository root
  (ZEROSERVE=path/to/zeroserve to use another build)
--only NAME[,NAME...] makes only those cases and replaces them in the existing ref.json, the others kept
as they are; a case made by another llama-cpp-python than the file's "peer" records its own "peer".
"""
import argparse, ctypes, json, math, os, shutil, struct, subprocess, sys, tempfile
import numpy as np
import llama_cpp
import gguf
from gguf import GGUFReader

HERE = os.path.dirname(os.path.abspath(__file__))
ZS = os.environ.get("ZEROSERVE", os.path.join(HERE, "..", "..", "..", "zeroserve"))
TOPK, N_PROMPT, N_NEW, N_CTX, INIT_STD = 8, 32, 16, 512, 0.1

TOPK_FEATS = lambda arch, n: [("top-1 routing (expert_used_count 1)", {arch + ".expert_used_count": ("u32", 1)}, {}),
                              ("every expert (expert_used_count = expert_count)",
                               {arch + ".expert_used_count": ("u32", n)}, {})]
QK_NORMS = ("q and k norms set to 1", {}, {"attn_q_norm.weight": 1.0, "attn_k_norm.weight": 1.0})
# name, --arch, --seed, --set, --dtype, peer weights, features: (what, {key: (type, value)}, {tensor suffix: fill})
CASES = [
    ("mixtral", "mixtral", 21, {}, "f32", "as stored", TOPK_FEATS("llama", 8)),
    ("mixtral-q8_0", "mixtral", 21, {}, "q8_0", "dequantized to f32", []),
    ("mixtral-q4_k_m", "mixtral", 21, {}, "q4_k_m", "dequantized to f32", []),
    ("qwen2moe", "qwen2moe", 22, {}, "f32", "as stored",
     TOPK_FEATS("qwen2moe", 16) + [("the shared expert (ffn_down_shexp zeroed)", {}, {"ffn_down_shexp.weight": 0.0})]),
    ("qwen2moe-q8_0", "qwen2moe", 22, {}, "q8_0", "dequantized to f32", []),
    ("qwen2moe-q4_k_m", "qwen2moe", 22, {}, "q4_k_m", "dequantized to f32", []),
    ("qwen2moe-tied", "qwen2moe", 26, {"tie_word_embeddings": True}, "f32", "as stored", []),
    ("qwen3moe", "qwen3moe", 23, {}, "f32", "as stored", TOPK_FEATS("qwen3moe", 16) + [QK_NORMS]),
    ("qwen3moe-q8_0", "qwen3moe", 23, {}, "q8_0", "dequantized to f32", []),
    ("olmoe", "olmoe", 24, {}, "f32", "as stored", TOPK_FEATS("olmoe", 16) + [QK_NORMS]),
    ("olmoe-q8_0", "olmoe", 24, {}, "q8_0", "dequantized to f32", []),
]


def prompt_ids(seed):
    """N_PROMPT ids in [0, 510] (511 is the random vocabulary's end-of-text) from a 32-bit LCG."""
    x, out = seed, []
    for _ in range(N_PROMPT):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append((x >> 8) % 511)
    return out


def checksum(path):
    """sum over the file's little-endian 64-bit words w[i] (zero-padded) of w[i] * (2i + 1), mod 2^64."""
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


def rewrite(src, dst, keys=None, fill=None, dequant=False):
    """src with keys set ((type, value)), every tensor whose name ends with a key of fill set to that
    value (F32 tensors only), every tensor dequantized to F32 if dequant; key/values copied as serialized."""
    keys, fill = keys or {}, fill or {}
    r = GGUFReader(src)
    kvs = [b"".join(np.asarray(p).tobytes() for p in f.parts) for k, f in r.fields.items()
           if not k.startswith("GGUF.") and k not in keys and not (dequant and k == "general.file_type")]
    kvs += [kv_bytes(k, *v) for k, v in keys.items()]
    if dequant:
        kvs.append(kv_bytes("general.file_type", "u32", 0))
    align = int(r.fields["general.alignment"].contents()) if "general.alignment" in r.fields else 32
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(r.tensors), len(kvs)))
    for b in kvs:
        out += b
    datas, off, filled = [], 0, set()
    for t in r.tensors:
        if dequant:
            a = np.ascontiguousarray(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), dtype="<f4").tobytes()
            ty = 0
        else:
            a, ty = np.asarray(t.data).tobytes(), int(t.tensor_type)
        for suf, v in fill.items():
            if t.name.endswith(suf):
                if ty != 0:
                    raise SystemExit("%s: fill needs an F32 tensor" % t.name)
                a = np.full(len(a) // 4, v, dtype="<f4").tobytes()
                filled.add(suf)
        name = t.name.encode()
        out += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(t.shape))
        out += b"".join(struct.pack("<Q", int(x)) for x in t.shape) + struct.pack("<IQ", ty, off)
        datas.append(a)
        off += (len(a) + align - 1) // align * align
    if set(fill) - filled:
        raise SystemExit("%s: no tensor ends with %s" % (src, sorted(set(fill) - filled)))
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
    ids, steps, last = [], [], None
    eos = llm.token_eos()
    for _ in range(N_NEW):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        if last is None:
            last = row
        top = np.argsort(-row, kind="stable")[:TOPK]
        m = row.max()
        steps.append({"top_ids": [int(i) for i in top], "top_logits": [round(float(row[i]), 6) for i in top],
                      "logsumexp": round(float(m + math.log(np.exp(row - m).sum())), 6)})
        nxt = int(top[0])
        ids.append(nxt)
        if nxt == eos:
            break
        llm.eval([nxt])
    del llm
    return ids, steps, last


def forced(path, prompt, ids):
    """The logits rows at the generated positions of a teacher-forced pass over prompt + ids."""
    llm = llm_open(path)
    llm.eval(prompt + ids[:-1])
    rows = np.array([llm.scores[len(prompt) - 1 + i] for i in range(len(ids))], dtype=np.float64)
    del llm
    return rows


HF_SNIPPET = r"""
import json, sys, torch, transformers
d, ids = sys.argv[1], json.loads(sys.argv[2])
m = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
with torch.no_grad():
    print(json.dumps(m(torch.tensor([ids])).logits[0, -1].tolist()))
"""


def transformers_last(py, d, prompt):
    p = subprocess.run([py, "-c", HF_SNIPPET, d, json.dumps(prompt)], capture_output=True, text=True, check=True)
    return np.array(json.loads(p.stdout.strip().splitlines()[-1]), dtype=np.float64)


def same_tensors(ours, theirs, allowed=(), head_copy=False):
    """(equal, total, unexplained differences) of two GGUF files' tensors and non-vocabulary keys;
    allowed: (name suffix, our type, their type) substitutions that are deliberate; head_copy: ours has
    output.weight, theirs none (a tied qwen2moe / olmoe), and it must be their token_embd.weight."""
    a, b = GGUFReader(ours), GGUFReader(theirs)
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    errs = []
    if head_copy:
        o, e = ta.pop("output.weight", None), tb.get("token_embd.weight")
        if o is None or "output.weight" in tb or e is None or o.tensor_type != e.tensor_type or \
                not np.array_equal(np.asarray(o.data).view(np.uint8), np.asarray(e.data).view(np.uint8)):
            errs.append("output.weight is not a copy of their token_embd.weight")
    if set(ta) != set(tb):
        errs.append("tensors only in ours %s, only in theirs %s" % (sorted(set(ta) - set(tb)), sorted(set(tb) - set(ta))))
    n = 0
    for k in sorted(set(ta) & set(tb)):
        x, y = ta[k], tb[k]
        if x.tensor_type == y.tensor_type and list(x.shape) == list(y.shape) and \
                np.array_equal(np.asarray(x.data).view(np.uint8), np.asarray(y.data).view(np.uint8)):
            n += 1
        elif not any(k.endswith(s) and x.tensor_type.name == o and y.tensor_type.name == t for s, o, t in allowed):
            errs.append("%s: ours %s %s, theirs %s %s" % (k, x.tensor_type.name, list(x.shape), y.tensor_type.name,
                                                          list(y.shape)))
    kv = lambda r: {k: f.contents() for k, f in r.fields.items() if not k.startswith(("GGUF.", "tokenizer.", "general."))}
    ka, kb = kv(a), kv(b)
    errs += ["key %s: ours %s, theirs %s" % (k, ka.get(k), kb.get(k)) for k in sorted(set(ka) | set(kb))
             if ka.get(k) != kb.get(k)]
    return n, len(tb), errs


def llama_quantize(src, dst, ftype):
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = ftype
    p.nthread = 2
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)) != 0:
        raise SystemExit("llama_model_quantize failed on " + src)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transformers-python", default="/tmp/tv/bin/python")
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated case names: replace just these in ref.json")
    a = ap.parse_args()
    only = [x for x in a.only.split(",") if x]
    if any(x not in [c[0] for c in CASES] for x in only):
        raise SystemExit("--only: unknown case in %s" % only)
    hf_py = None if a.no_transformers or not os.path.exists(a.transformers_python) else a.transformers_python
    if not os.path.exists(ZS):
        raise SystemExit(f"{ZS}: not found (make zeroserve, or set ZEROSERVE)")
    tmp = tempfile.mkdtemp(prefix="zs-moe-ref-")
    ref = {"peer": f"llama.cpp via llama-cpp-python=={llama_cpp.__version__}", "topk": TOPK, "n_ctx": N_CTX,
           "cases": []}
    for name, arch, seed, sets, dtype, peer, feats in CASES:
        if only and name not in only:
            continue
        d = os.path.join(tmp, name)
        path = os.path.join(tmp, name + ".gguf")
        subprocess.run([ZS, "init-model", "--arch", arch, "--random-norms", "--init-std", str(INIT_STD), "--seed",
                        str(seed), "--set", json.dumps(sets), "--out", d], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([ZS, "convert", "--model", d, "--out", path, "--dtype", dtype, "--name", "zs-peer"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = GGUFReader(path)
        ga = r.fields["general.architecture"].contents()
        n_exp = int(r.fields[ga + ".expert_count"].contents())
        assert n_exp > 1 and any(t.name.endswith("ffn_gate_exps.weight") and len(t.shape) == 3 for t in r.tensors)
        checks = {}
        if dtype == "q4_k_m":  # llama-quantize on zeroserve's f32 conversion of the same checkpoint
            f32, lq = os.path.join(tmp, name + "-conv-f32.gguf"), os.path.join(tmp, name + "-lq.gguf")
            subprocess.run([ZS, "convert", "--model", d, "--out", f32, "--dtype", "f32", "--name", "zs-peer"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            llama_quantize(f32, lq, 15)
            n, nt, errs = same_tensors(path, lq)
            if errs:
                raise SystemExit("%s: differs from llama-quantize's file: %s" % (name, "; ".join(errs)))
            checks["llama_quantize"] = "%d/%d tensors byte-equal" % (n, nt)
        if hf_py and dtype in ("f32", "q8_0"):  # llama.cpp's own convert_hf_to_gguf.py
            sys.path.insert(0, os.path.join(HERE, ".."))
            import check_convert
            theirs = os.path.join(tmp, name + "-converter.gguf")
            script = os.path.join(os.path.dirname(os.path.dirname(llama_cpp.__file__)), "bin", "convert_hf_to_gguf.py")
            check_convert.run_converter(hf_py, script, d, theirs, dtype, tmp)
            copy = bool(sets.get("tie_word_embeddings")) and ga in ("qwen2moe", "olmoe")
            n, nt, errs = same_tensors(path, theirs, head_copy=copy)
            if errs:
                raise SystemExit("%s: differs from convert_hf_to_gguf.py's file: %s" % (name, "; ".join(errs)))
            checks["convert_hf_to_gguf"] = "%d/%d tensors byte-equal, keys equal%s" % (n, nt, (
                "; output.weight added, their token_embd.weight (llama.cpp's %s requires it; their file does not "
                "load)" % ga) if copy else "")
        run_path = path
        if peer == "dequantized to f32":
            run_path = os.path.join(tmp, name + "-f32.gguf")
            rewrite(path, run_path, dequant=True)
        prompt = prompt_ids(seed)
        ids, steps, last = greedy(run_path, prompt)
        hf_diff = None
        if hf_py and dtype == "f32":
            hf_diff = float(np.abs(transformers_last(hf_py, d, prompt) - last).max())
            if hf_diff > 1e-4:
                raise SystemExit(f"{name}: llama.cpp's logits differ from transformers' by {hf_diff}")
        case = {"name": name, "arch": arch, "gguf_arch": ga, "n_experts": n_exp, "seed": seed, "init_std": INIT_STD, "set": sets,
                "dtype": dtype, "peer_weights": peer, "gguf_checksum": checksum(path), "prompt_ids": prompt,
                "ids": ids, "last_logits": [round(float(x), 5) for x in last], "steps": steps, "features": []}
        if hf_diff is not None:
            case["transformers_max_diff"] = float("%.3g" % hf_diff)
        case.update(checks)
        if feats:
            base = forced(run_path, prompt, ids)
        for what, keys, fill in feats:
            v = os.path.join(tmp, name + "-variant.gguf")
            rewrite(run_path, v, keys=keys, fill=fill)
            delta = float(np.abs(forced(v, prompt, ids) - base).max())
            case["features"].append({"what": what, "delta": round(delta, 6)})
        ref["cases"].append(case)
        print("%-16s %-8s ids %s; vs transformers %s; %s; features: %s" % (
            name, ga, ids, "-" if hf_diff is None else "%.2g" % hf_diff,
            "; ".join("vs %s %s" % kv for kv in checks.items()) or "-", ", ".join(
                "%s %.3g" % (f["what"], f["delta"]) for f in case["features"]) or "-"), file=sys.stderr)
    out = os.path.join(HERE, "ref.json")
    if only:  # the other cases as the file has them
        with open(out) as f:
            old = json.load(f)
        new = {c["name"]: c for c in ref["cases"]}
        for c in new.values():
            if ref["peer"] != old["peer"]:
                c["peer"] = ref["peer"]
        old["cases"] = [new.get(c["name"], c) for c in old["cases"]]
        ref = old
    with open(out, "w") as f:
        json.dump(ref, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print("wrote", out, file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
