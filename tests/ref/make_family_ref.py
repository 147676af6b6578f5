#!/usr/bin/env python3
"""make_family_ref.py — reference data for tests/test-families.c: the model families and RoPE
scalings (Llama + llama3 / linear / dynamic RoPE, Qwen2 + YaRN, Qwen3, Gemma 2, Gemma 3, Phi-3 +
LongRoPE, Mistral) as Hugging Face transformers (the definition) computes them.

For each case below this runs `zeroserve init-model <args> --random-norms --out DIR` (init-model is
deterministic by seed: the C test regenerates the identical model from the same args, and checks
the checksum recorded here), loads DIR with
    AutoModelForCausalLM.from_pretrained(DIR, dtype=torch.float32, attn_implementation="eager")
and records
  (a) the logits of a fixed sequence of SEQ tokens at LOGIT_POSITIONS, computed TOKEN BY TOKEN
      through the KV cache (past_key_values): zeroserve defines dynamic and longrope RoPE per
      token position (engine/model/rope.h), which is what transformers computes when fed one
      token at a time. For the other RoPE types a full-sequence forward must agree with the
      token-by-token one (checked here, printed);
  (b) the gradient of the mean next-token cross-entropy over a batch of B=2 sequences of T tokens
      (T > the sliding window; T <= the original context for dynamic / longrope, since a
      full forward uses one frequency set for the whole call), with the first 3 targets of
      sequence 1 masked: the loss, and for every parameter (HF names) its L2 norm, the element of
      largest magnitude (index and value) and N_SAMPLE elements at indices drawn by the LCG in
      sample_indices() (the C test draws the same ones).

Writes tests/ref/family-ref.json (cases, tokens, args, per-tensor index) and tests/ref/family-ref.bin
(float32 little-endian: per case the logits [positions x vocab], then per tensor the largest
element and the samples).

Re-run (from the repository root, after `make`; needs torch 2.9.1 + transformers 4.57.3):
    /tmp/tv/bin/python tests/ref/make_family_ref.py [--zeroserve ./zeroserve] [--only NAME]
--only regenerates nothing: it prints one case's figures (a check while debugging).
"""
import argparse, json, os, struct, subprocess, sys, tempfile

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
SEQ = 192
LOGIT_POSITIONS = [0, 47, 48, 63, 64, 96, 150, 191]
B = 2
N_SAMPLE = 64
M64 = (1 << 64) - 1


def longrope_factors(n):
    """Deterministic 'random-ish' LongRoPE factors in [1, 4] (short near 1, long rising to 4)."""
    rng = np.random.default_rng(31)
    short = [round(float(1.0 + 0.15 * (i / (n - 1)) ** 2 + 0.05 * rng.random()), 4) for i in range(n)]
    long = [round(float(1.0 + 2.8 * (i / (n - 1)) ** 1.5 + 0.2 * rng.random()), 4) for i in range(n)]
    return short, long


def common(arch, layers, dim, heads, kv, hd, ffn, ctx, seed):
    return ["--arch", arch, "--layers", str(layers), "--dim", str(dim), "--heads", str(heads),
            "--kv-heads", str(kv), "--head-dim", str(hd), "--ffn", str(ffn), "--vocab", "512",
            "--context", str(ctx), "--seed", str(seed)]


def cases():
    # init-model's matrices are N(0, 0.02): attention scores of ~0.1 and logits of ~0.3. Gemma 2's
    # real soft-caps (50 / 30) would then change nothing measurable, so its case caps at 0.5 / 3
    # (well inside the tanh's curve); query_pre_attn_scalar is hidden / heads (128) as in Gemma 2
    # 27B / Gemma 3 27B, not head_dim (where it would equal the default 1 / sqrt(head_dim)).
    lr_short, lr_long = longrope_factors(32)
    return [
        dict(name="llama-llama3", T=80,
             args=common("llama", 2, 256, 2, 1, 128, 512, 256, 11) + ["--rope-theta", "500000", "--rope-scaling",
                  json.dumps({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 64})]),
        dict(name="llama-linear", T=80,
             args=common("llama", 2, 256, 4, 2, 64, 512, 256, 12) + ["--rope-scaling",
                  json.dumps({"rope_type": "linear", "factor": 4.0})]),
        # dynamic: max_position_embeddings 96, our context factor x 96 = 192
        dict(name="llama-dynamic", T=80, pos_dependent=True,
             args=common("llama", 2, 256, 4, 2, 64, 512, 96, 13) + ["--rope-scaling",
                  json.dumps({"rope_type": "dynamic", "factor": 2.0})]),
        dict(name="qwen2-yarn", T=80,
             args=common("qwen2", 2, 256, 2, 1, 128, 512, 256, 14) + ["--rope-scaling",
                  json.dumps({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})]),
        dict(name="qwen3", T=80,
             args=common("qwen3", 2, 256, 4, 2, 128, 512, 256, 15)),
        dict(name="gemma2", T=80,
             args=common("gemma2", 4, 256, 2, 1, 256, 512, 256, 16) + ["--sliding-window", "48", "--set", json.dumps(
                 {"attn_logit_softcapping": 0.5, "final_logit_softcapping": 3.0, "query_pre_attn_scalar": 128})]),
        # Gemma 3: 5 local layers (rope_local_base_freq 10000) + 1 global (rope_theta 1e6, linear x8)
        dict(name="gemma3", T=80,
             args=common("gemma3", 6, 256, 2, 1, 256, 512, 256, 17) + ["--sliding-window", "48", "--rope-theta",
                  "1000000", "--rope-scaling", json.dumps({"rope_type": "linear", "factor": 8.0}),
                  "--set", json.dumps({"query_pre_attn_scalar": 128})]),
        dict(name="phi3-longrope", T=64, pos_dependent=True,
             args=common("phi3", 2, 256, 4, 2, 64, 512, 256, 18) + ["--sliding-window", "48", "--set",
                  json.dumps({"original_max_position_embeddings": 64}), "--rope-scaling",
                  json.dumps({"rope_type": "longrope", "short_factor": lr_short, "long_factor": lr_long})]),
        dict(name="mistral", T=80,
             args=common("mistral", 2, 256, 4, 1, 128, 512, 256, 19) + ["--sliding-window", "48"]),
    ]


def checksum(path):
    """The file as little-endian uint32 words (zero-padded), sum of w_i * (2i + 1) mod 2^64: the C
    test computes the same to know it regenerated the identical model."""
    d = open(path, "rb").read()
    d += b"\0" * (-len(d) % 4)
    w = np.frombuffer(d, dtype="<u4").astype(np.uint64)
    k = np.arange(len(w), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    with np.errstate(over="ignore"):
        return "%016x" % int(np.sum(w * k, dtype=np.uint64))


def sample_indices(tensor_index, numel, n=N_SAMPLE):
    s = tensor_index + 1
    out = []
    for _ in range(n):
        s = (s * 6364136223846793005 + 1442695040888963407) & M64
        out.append((s >> 33) % numel)
    return out


def hf_fixups(d, name):
    """transformers 4.57's Phi3Config accepts rope_scaling only as {"type", "short_factor",
    "long_factor"} (exactly those three keys); zeroserve writes "rope_type" (which it also reads).
    Same model, key spelled the way Phi3Config wants."""
    p = os.path.join(d, "config.json")
    c = json.load(open(p))
    rs = c.get("rope_scaling")
    if c.get("model_type") == "phi3" and rs and rs.get("rope_type") == "longrope":
        c["rope_scaling"] = {"type": "longrope", "short_factor": rs["short_factor"], "long_factor": rs["long_factor"]}
        json.dump(c, open(p, "w"), indent=2)
        return "phi3: rope_scaling rewritten as {type, short_factor, long_factor} for Phi3Config"
    return None


def load(d):
    # pad_token_id None: Gemma's (0) and Phi-3's (32000) defaults would make nn.Embedding zero the
    # gradient of that row (a padding row); zeroserve has no padding row
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager", pad_token_id=None)
    m.eval()
    return m


def logits_incremental(m, ids):
    pkv, rows = None, []
    with torch.no_grad():
        for i in range(ids.shape[1]):
            out = m(input_ids=ids[:, i:i + 1], past_key_values=pkv, use_cache=True)
            pkv = out.past_key_values
            rows.append(out.logits[0, -1].clone())
    return torch.stack(rows)


def run_case(cs, zs, ci, tmp):
    d = os.path.join(tmp, cs["name"])
    args = cs["args"] + ["--random-norms"]
    subprocess.run([zs, "init-model"] + args + ["--out", d], check=True, stdout=subprocess.DEVNULL)
    ck = checksum(os.path.join(d, "model.safetensors"))
    note = hf_fixups(d, cs["name"])
    m = load(d)
    V = m.config.vocab_size
    rng = np.random.default_rng(1000 + ci)
    ids = torch.tensor(rng.integers(0, V, size=(1, SEQ)), dtype=torch.long)
    inc = logits_incremental(m, ids)
    with torch.no_grad():
        full = m(input_ids=ids).logits[0]
    dfull = (inc - full).abs().max().item()
    pos_dep = cs.get("pos_dependent", False)
    print("%-14s full-sequence forward vs token by token: max |d| = %.3g%s" % (
        cs["name"], dfull, " (position-dependent RoPE: differs by definition)" if pos_dep else ""))
    if not pos_dep:
        assert dfull < 1e-5, (cs["name"], dfull)
    logits = inc[LOGIT_POSITIONS].numpy().astype("<f4")

    # (b) gradients
    T = cs["T"]
    tr = torch.tensor(rng.integers(0, V, size=(B, T + 1)), dtype=torch.long)
    x, y = tr[:, :T], tr[:, 1:].clone()
    y[1, :3] = -100
    m.zero_grad(set_to_none=True)
    with torch.enable_grad():
        lg = m(input_ids=x).logits
        loss = F.cross_entropy(lg.reshape(-1, V), y.reshape(-1), ignore_index=-100)
        loss.backward()
    tensors, vals = [], []
    for ti, (name, p) in enumerate(m.named_parameters()):
        g = p.grad.detach().reshape(-1).double()
        n = g.numel()
        am = int(torch.argmax(g.abs()).item())
        idx = sample_indices(ti, n)
        tensors.append(dict(name=name, shape=list(p.shape), numel=n, norm=float(g.norm().item()), argmax=am))
        vals.append(np.concatenate([[g[am].item()], g[idx].numpy()]).astype("<f4"))
    ycl = y.clone()
    ycl[ycl == -100] = -1
    rec = dict(name=cs["name"], family=m.config.model_type, init_args=args, safetensors_checksum=ck,
               transformers_class=type(m).__name__, vocab=V, tokens=ids[0].tolist(),
               logit_positions=LOGIT_POSITIONS, full_vs_incremental=dfull,
               train=dict(B=B, T=T, tokens=x.tolist(), targets=ycl.tolist(), loss=float(loss.item()),
                          n_sample=N_SAMPLE, tensors=tensors))
    if note:
        rec["note"] = note
    print("%-14s loss %.6f, %d parameter tensors, logits std %.3f" % (cs["name"], loss.item(), len(tensors),
                                                                     float(inc.std())))
    return rec, logits, vals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zeroserve", default="./zeroserve")
    ap.add_argument("--only", default=None)
    a = ap.parse_args()
    torch.manual_seed(0)
    recs, blobs = [], []
    with tempfile.TemporaryDirectory(prefix="zs-famref-") as tmp:
        for ci, cs in enumerate(cases()):
            if a.only and cs["name"] != a.only:
                continue
            rec, logits, vals = run_case(cs, a.zeroserve, ci, tmp)
            recs.append(rec)
            blobs.append((logits, vals))
    if a.only:
        return
    off, parts = 0, []
    for rec, (logits, vals) in zip(recs, blobs):
        rec["logits_offset"] = off
        parts.append(logits.reshape(-1))
        off += logits.size
        for t, v in zip(rec["train"]["tensors"], vals):
            t["offset"] = off
            parts.append(v)
            off += v.size
    data = np.concatenate(parts).astype("<f4")
    open(os.path.join(HERE, "family-ref.bin"), "wb").write(data.tobytes())
    doc = dict(format=1, bin="family-ref.bin", bin_floats=int(data.size),
               generator="tests/ref/make_family_ref.py (torch %s, transformers %s)" % (
                   torch.__version__, __import__("transformers").__version__),
               seq=SEQ, cases=recs)
    with open(os.path.join(HERE, "family-ref.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print("wrote tests/ref/family-ref.json and family-ref.bin (%d floats)" % data.size)


if __name__ == "__main__":
    main()
