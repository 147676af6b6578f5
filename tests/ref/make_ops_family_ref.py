#!/usr/bin/env python3
"""make_ops_family_ref.py — PyTorch/transformers reference data for tests/test-ops-family.c: the
model-family ops as transformers itself computes them, forward and gradient, in float64 (so the
file pins down the semantics, not one float32 rounding):

  attention   transformers.models.gemma2.modeling_gemma2.eager_attention_forward (scaling, the
              soft-cap x / cap, tanh, * cap, GQA by repeat_kv) with the additive mask of
              masking_utils.sliding_window_causal_mask_function (kv_idx > q_idx - window and
              kv_idx <= q_idx): out and d(Σ c·out)/d(q, k, v), for a few (scale, softcap, window);
  softcap     Gemma 2's final-logit soft-cap (x / cap, tanh, * cap) and its gradient;
  geglu       ACT2FN["gelu_pytorch_tanh"](gate) * up (GemmaMLP) and its gradients;
  rmsnorm     Gemma2RMSNorm (x · rsqrt(mean x² + eps) · (1 + w)) and its gradients (x, w);
  rope        Llama's apply_rotary_pos_emb (rotate_half) with cos/sin of pos · inv_freq times an
              attention factor, and its gradient.

Inputs are float32 values (from a fixed torch generator), stored exactly; every output is the
float64 result. Writes tests/ref/ops-family-ref.json (small, committed). Re-run from the repository
root with the venv that has torch and transformers:
  /tmp/tv/bin/python tests/ref/make_ops_family_ref.py      # torch 2.9.1, transformers 4.57.3
"""
import json, os
from types import SimpleNamespace

import torch
from transformers.activations import ACT2FN
from transformers.masking_utils import sliding_window_causal_mask_function, causal_mask_function
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm, eager_attention_forward
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

HERE = os.path.dirname(os.path.abspath(__file__))
g = torch.Generator().manual_seed(1234)


def rnd(*shape, s=1.0):
    """float32 values, returned as float64 leaves"""
    return (torch.randn(*shape, generator=g, dtype=torch.float32) * s).to(torch.float64).requires_grad_(True)


def flat(t):
    """inputs: float32 values, 9 significant digits (exact); outputs: 10 digits (the test's
    tolerances are 1e-6 and coarser)"""
    digits = "%.9g" if t.requires_grad and t.is_leaf else "%.10g"
    return [float(digits % v) for v in t.detach().reshape(-1).tolist()]


def attention_case(T, nh, nkv, hd, scale, softcap, window):
    q, k, v = rnd(T, nh, hd), rnd(T, nkv, hd), rnd(T, nkv, hd)
    c = rnd(T, nh, hd).detach().requires_grad_(True)  # (a leaf: stored exactly)
    # the additive mask of transformers' mask functions, over (q_idx, kv_idx)
    fn = sliding_window_causal_mask_function(window) if window > 0 else causal_mask_function
    mask = torch.zeros(1, 1, T, T, dtype=torch.float64)
    for i in range(T):
        for j in range(T):
            if not bool(fn(torch.tensor(0), torch.tensor(0), torch.tensor(i), torch.tensor(j))):
                mask[0, 0, i, j] = torch.finfo(torch.float64).min
    module = SimpleNamespace(head_dim=hd, num_key_value_groups=nh // nkv, training=False)
    # [batch, heads, T, hd] as the model's attention hands them over
    out, _ = eager_attention_forward(module, q.permute(1, 0, 2)[None], k.permute(1, 0, 2)[None],
                                     v.permute(1, 0, 2)[None], mask, dropout=0.0,
                                     scaling=scale if scale else None, softcap=softcap if softcap else None)
    out = out[0]  # [T, nh, hd] (eager_attention_forward transposes back)
    (out * c).sum().backward()
    return {"T": T, "nh": nh, "nkv": nkv, "hd": hd, "scale": scale, "softcap": softcap, "window": window,
            "q": flat(q), "k": flat(k), "v": flat(v), "c": flat(c), "out": flat(out),
            "dq": flat(q.grad), "dk": flat(k.grad), "dv": flat(v.grad)}


def main():
    ref = {"attention": [attention_case(11, 4, 2, 8, 0.0, 0.0, 0),
                         attention_case(11, 4, 2, 8, 0.0, 0.0, 4),
                         attention_case(11, 4, 2, 8, 0.7, 1.5, 5),
                         attention_case(10, 3, 1, 6, 0.25, 2.0, 3)]}
    x, c = rnd(40, s=4.0), rnd(40)
    y = torch.tanh(x / 3.0) * 3.0
    (y * c).sum().backward()
    ref["softcap"] = {"cap": 3.0, "x": flat(x), "c": flat(c), "y": flat(y), "dx": flat(x.grad)}
    gate, up, c = rnd(40, s=2.0), rnd(40), rnd(40)
    y = ACT2FN["gelu_pytorch_tanh"](gate) * up
    (y * c).sum().backward()
    ref["geglu"] = {"gate": flat(gate), "up": flat(up), "c": flat(c), "y": flat(y), "dgate": flat(gate.grad),
                    "dup": flat(up.grad)}
    T, d = 3, 16
    norm = Gemma2RMSNorm(d, eps=1e-6).to(torch.float64)
    w = (torch.randn(d, generator=g, dtype=torch.float32) * 0.3).to(torch.float64)
    with torch.no_grad():
        norm.weight.copy_(w)
    x, c = rnd(T, d, s=2.0), rnd(T, d)
    y = norm(x)
    (y * c).sum().backward()
    ref["rmsnorm"] = {"T": T, "d": d, "eps": 1e-6, "off": 1.0, "x": flat(x), "w": flat(w), "c": flat(c), "y": flat(y),
                      "dx": flat(x.grad), "dw": flat(norm.weight.grad)}
    nh, hd, pos, af = 2, 16, 1234, 1.3
    inv = (1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))) * torch.tensor(
        [1.0, 0.5, 0.25, 1.0, 0.125, 1.0, 0.5, 1.0])  # an arbitrary float32 table
    ang = (torch.tensor(float(pos), dtype=torch.float32) * inv)  # the float32 product, as ops.h says
    emb = torch.cat((ang, ang)).to(torch.float64)
    cos, sin = emb.cos() * af, emb.sin() * af
    x, c = rnd(1, nh, 1, hd), rnd(1, nh, 1, hd)
    yq, _ = apply_rotary_pos_emb(x, x, cos[None, None], sin[None, None])
    (yq * c).sum().backward()
    ref["rope"] = {"nh": nh, "hd": hd, "pos": pos, "attn_factor": af, "inv_freq": flat(inv), "x": flat(x),
                   "c": flat(c), "y": flat(yq), "dx": flat(x.grad)}
    ref["generator"] = ("tests/ref/make_ops_family_ref.py, torch %s, transformers %s" %
                        (torch.__version__, __import__("transformers").__version__))
    path = os.path.join(HERE, "ops-family-ref.json")
    with open(path, "w") as f:
        json.dump(ref, f, separators=(",", ":"))
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
