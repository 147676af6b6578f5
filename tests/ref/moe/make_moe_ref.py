#!/usr/bin/env python3
"""make_moe_ref.py — reference data for tests/test-moe.c: the four mixture-of-experts architectures
(Mixtral, Qwen2-MoE with its shared expert and a dense layer, Qwen3-MoE with a dense layer, OLMoE
with clip_qkv) as Hugging Face transformers (the definition) computes them.

For each case below this runs `zeroserve init-model <args> --out DIR` (init-model is deterministic
by seed: the C test regenerates the identical model from the same args through the CLI's own
parser, and checks the checksum recorded here), loads DIR with
    AutoModelForCausalLM.from_pretrained(DIR, dtype=torch.float32, attn_implementation="eager")
and records, for a fixed sequence of SEQ tokens:
  (a) the logits at LOGIT_POSITIONS of one forward of the whole sequence (a token-by-token forward
      through the KV cache must agree within 1e-5: checked, printed);
  (b) the experts each token was routed to in each sparse layer (torch.topk of the softmax of the
      router's logits, captured with a forward hook on the router), in top-k order, and the smallest
      gap between a token's k-th and (k+1)-th probability over the whole case, which must exceed
      MIN_MARGIN so that no rounding can route a token differently in the C code (asserted).
The matrices are N(0, 0.1) (--init-std 0.1) rather than init-model's default 0.02: a router of 0.02
gives near-uniform probabilities whose top-k gaps come within 1e-5 of each other.

Writes tests/ref/moe/moe-ref.json (cases, args, checksums, parameter counts, tokens, routes, margins) and
tests/ref/moe/moe-ref.bin (float32 little-endian: per case the logits [positions x vocab]).

Re-run (from the repository root, after `make`; needs torch 2.9.1 + transformers 4.57.3):
    /tmp/tv/bin/python tests/ref/moe/make_moe_ref.py [--zeroserve ./zeroserve]
"""
import argparse, json, os, subprocess, sys, tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
SEQ = 40
LOGIT_POSITIONS = [0, 3, 11, 20, 27, 33, 39]
MIN_MARGIN = 1e-4


def common(arch, layers, heads, kv, ffn, experts, used, seed):
    return ["--arch", arch, "--layers", str(layers), "--dim", "64", "--heads", str(heads), "--kv-heads", str(kv),
            "--ffn", str(ffn), "--vocab", "300", "--context", "64", "--experts", str(experts),
            "--experts-used", str(used), "--seed", str(seed), "--init-std", "0.1", "--random-norms"]


def cases():
    return [
        # Mixtral: every layer sparse, the experts intermediate_size (32) wide, renormalised top-2
        dict(name="mixtral", args=common("mixtral", 2, 4, 2, 32, 8, 2, 41)),
        # Qwen2-MoE: shared expert (48) with its sigmoid gate, qkv biases, layer 1 dense (ffn 96),
        # norm_topk_prob false (its default)
        dict(name="qwen2moe", args=common("qwen2moe", 3, 4, 2, 96, 8, 2, 42) + [
            "--moe-ffn", "32", "--shared-ffn", "48", "--mlp-only-layers", "1"]),
        # Qwen3-MoE: per-head q/k norms, head_dim 16, top-3 renormalised (its default), decoder_sparse_step 1
        # with layer 0 dense
        dict(name="qwen3moe", args=common("qwen3moe", 3, 4, 2, 96, 8, 3, 43) + [
            "--head-dim", "16", "--moe-ffn", "32", "--sparse-step", "1", "--mlp-only-layers", "0"]),
        # OLMoE: q_norm / k_norm over the whole projections, clip_qkv 1.0 (clamps about a third of q and k
        # after the norms and of v), norm_topk_prob true (not its default)
        dict(name="olmoe", args=common("olmoe", 2, 4, 2, 32, 8, 2, 45) + [
            "--set", json.dumps({"clip_qkv": 1.0, "norm_topk_prob": True})]),
    ]


def checksum(path):
    """The file as little-endian uint32 words (zero-padded), sum of w_i * (2i + 1) mod 2^64 (the C test
    computes the same to know it regenerated the identical model)."""
    d = open(path, "rb").read()
    d += b"\0" * (-len(d) % 4)
    w = np.frombuffer(d, dtype="<u4").astype(np.uint64)
    k = np.arange(len(w), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    with np.errstate(over="ignore"):
        return "%016x" % int(np.sum(w * k, dtype=np.uint64))


def routers(m):
    """{layer: router nn.Linear} of the sparse layers."""
    out = {}
    for i, layer in enumerate(m.model.layers):
        blk = getattr(layer, "block_sparse_moe", None) or layer.mlp
        if hasattr(blk, "experts"):
            out[i] = blk.gate
    return out


def run_case(cs, zs, tmp, ci):
    d = os.path.join(tmp, cs["name"])
    subprocess.run([zs, "init-model"] + cs["args"] + ["--out", d], check=True, stdout=subprocess.DEVNULL)
    ck = checksum(os.path.join(d, "model.safetensors"))
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    cfg = m.config
    V, k = cfg.vocab_size, cfg.num_experts_per_tok
    rng = np.random.default_rng(2000 + ci)
    ids = torch.tensor(rng.integers(0, V, size=(1, SEQ)), dtype=torch.long)
    caps = {}
    hooks = [g.register_forward_hook(lambda mod, inp, out, l=l: caps.__setitem__(l, out.detach().clone()))
             for l, g in routers(m).items()]
    with torch.no_grad():
        full = m(input_ids=ids).logits[0]
    for h in hooks:
        h.remove()
    routes, margin = [], 1.0
    for l in range(cfg.num_hidden_layers):
        if l not in caps:
            routes.append(None)
            continue
        p = torch.softmax(caps[l].reshape(SEQ, -1).float(), dim=-1)
        top = torch.topk(p, k, dim=-1)
        s = torch.sort(p, dim=-1, descending=True).values
        margin = min(margin, float((s[:, k - 1] - s[:, k]).min().item()))
        routes.append(top.indices.tolist())
    assert margin > MIN_MARGIN, (cs["name"], margin)
    # the same logits token by token through the KV cache
    pkv, rows = None, []
    with torch.no_grad():
        for i in range(SEQ):
            out = m(input_ids=ids[:, i:i + 1], past_key_values=pkv, use_cache=True)
            pkv = out.past_key_values
            rows.append(out.logits[0, -1])
    dinc = (torch.stack(rows) - full).abs().max().item()
    assert dinc < 1e-5, (cs["name"], dinc)
    logits = full[LOGIT_POSITIONS].numpy().astype("<f4")
    scale = float(full.abs().max().item())
    sparse = [l for l in range(cfg.num_hidden_layers) if routes[l] is not None]
    print("%-9s %s: sparse layers %s, top-%d of %d, smallest top-k gap %.2e, |logits| <= %.3f, "
          "token by token vs whole: %.2g" % (cs["name"], type(m).__name__, sparse, k, caps[sparse[0]].shape[-1],
                                            margin, scale, dinc))
    rec = dict(name=cs["name"], transformers_class=type(m).__name__, init_args=cs["args"], safetensors_checksum=ck,
               vocab=V, n_params=sum(p.numel() for p in m.parameters()), n_experts_used=k, tokens=ids[0].tolist(), logit_positions=LOGIT_POSITIONS,
               logit_scale=scale, routes=routes, min_topk_margin=margin, incremental_vs_full=dinc)
    return rec, logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zeroserve", default="./zeroserve")
    a = ap.parse_args()
    torch.manual_seed(0)
    recs, bins, off = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for ci, cs in enumerate(cases()):
            rec, lg = run_case(cs, a.zeroserve, tmp, ci)
            rec["logits_offset"] = off
            off += lg.size
            recs.append(rec)
            bins.append(lg.reshape(-1))
    import transformers
    out = dict(format=1, bin="moe-ref.bin", bin_floats=off, seq=SEQ,
               generator="tests/ref/moe/make_moe_ref.py (torch %s, transformers %s)" % (
                   torch.__version__, transformers.__version__), cases=recs)
    with open(os.path.join(HERE, "moe-ref.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    np.concatenate(bins).astype("<f4").tofile(os.path.join(HERE, "moe-ref.bin"))
    print("wrote tests/ref/moe/moe-ref.json and moe-ref.bin (%d floats)" % off)


if __name__ == "__main__":
    sys.exit(main())
