#!/usr/bin/env python3
"""make_moe_grad_ref.py — reference data for tests/test-moe-train.c (issue 15: "gradients against
transformers itself on the same small random configs"): one training step of small random mixtures
of experts (Mixtral, Qwen2-MoE with a dense layer and its shared expert, Qwen3-MoE with q/k norms and
renormalised top-k, OLMoE with whole-projection q/k norms and clip_qkv) as Hugging Face transformers
4.57.3 computes it in float32, with output_router_logits true and a nonzero router_aux_loss_coef.

Per case this runs `zeroserve init-model <args> --random-norms --out DIR` (deterministic by seed: the
C test regenerates the identical model with the same args and checks the checksum recorded here),
loads DIR with
    AutoModelForCausalLM.from_pretrained(DIR, dtype=torch.float32, attn_implementation="eager")
and records
  (a) the loss of a fixed batch of B=2 sequences of T=16 tokens, 3 targets masked (-1), as zeroserve
      defines it (engine/train/backward.h): the mean next-token cross-entropy over the counted targets
      plus router_aux_loss_coef * transformers' aux_loss (load_balancing_loss_func over the sparse
      layers' router logits, no attention_mask: every token counts), i.e. transformers' own `loss`
      when it is given those labels; ce and aux apart; the smallest gap between a token's k-th and
      (k+1)-th routing probability (a near tie would make the top-k choice fragile);
      the gradient of every parameter (HF names): its L2 norm, its largest element (index, value)
      and N_SAMPLE elements at indices drawn by sample_indices() (the C test draws the same), and
      every element of the routers, of Qwen2-MoE's shared_expert_gate and of layer 0's expert 1
      gate projection (w1);
  (b) the losses of 3 torch.optim.AdamW steps (foreach=False; lr 1e-2, betas 0.9/0.95, eps 1e-8,
      weight decay 0.1, every parameter) on a batch of B=1 sequence of T=8 tokens, small enough
      that some experts receive no token in some steps: their grad is None and AdamW leaves them
      (and their per-parameter step count) alone -- except in OLMoE, whose block runs every expert
      (zero gradients, updated); steps.losses[k] = the loss after k updates, steps.unused = for
      each step the parameters whose grad was None.

  (c) Qwen2-MoE only: one LoRA step's loss and adapter gradient from PEFT (lora_grad below).

Writes tests/ref/moe-grad/reference.json and tests/ref/moe-grad/reference.bin (float32 little-endian,
per tensor: the largest element then the samples, or every element for the full ones; offsets in
the JSON), and tests/ref/moe-grad/lora-qwen2moe/{adapter,grad}/.

Re-run (from the repository root, after `make`; needs torch 2.9.1 + transformers 4.57.3 + peft 0.17.1):
    /tmp/tv/bin/python tests/ref/moe-grad/make_moe_grad_ref.py [--zeroserve ./zeroserve]
"""
import argparse, json, os, subprocess, tempfile

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
B, T = 2, 16
SB, ST, N_STEPS = 1, 8, 3
N_SAMPLE = 32
M64 = (1 << 64) - 1
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
AUX = {"output_router_logits": True, "router_aux_loss_coef": 0.25}


def common(arch, layers, experts, used, moe_ffn, seed, extra=()):
    return (["--arch", arch, "--layers", str(layers), "--dim", "64", "--heads", "4", "--kv-heads", "2",
             "--head-dim", "16", "--vocab", "300", "--context", "64", "--seed", str(seed),
             "--experts", str(experts), "--experts-used", str(used), "--moe-ffn", str(moe_ffn)] + list(extra))


def cases():
    return [
        dict(name="mixtral", args=common("mixtral", 2, 8, 2, 96, 31, ["--ffn", "96"])),
        # 3 layers, layer 1 dense (mlp_only_layers), a shared expert, top-4 of 16 not renormalised
        dict(name="qwen2moe", lora=True, args=common("qwen2moe", 3, 16, 4, 32, 22,
                                          ["--ffn", "112", "--shared-ffn", "80", "--mlp-only-layers", "1"])),
        dict(name="qwen3moe", args=common("qwen3moe", 2, 16, 4, 32, 46, ["--ffn", "112"])),
        dict(name="olmoe", args=common("olmoe", 2, 16, 4, 32, 24, ["--ffn", "32"]), set={"clip_qkv": 1.2}),
    ]


def checksum(path):
    """make_family_ref.py's: little-endian uint32 words w_i (zero-padded), sum w_i * (2i + 1)."""
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


def full_tensor(name):
    return (name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight")
            or name.endswith("shared_expert_gate.weight") or name.endswith("layers.0.mlp.experts.1.gate_proj.weight")
            or name.endswith("layers.0.block_sparse_moe.experts.1.w1.weight"))


def loss_of(m, x, y):
    out = m(input_ids=x, output_router_logits=True)
    V = out.logits.shape[-1]
    ce = F.cross_entropy(out.logits.reshape(-1, V), y.reshape(-1), ignore_index=-1, reduction="mean")
    return ce + m.config.router_aux_loss_coef * out.aux_loss, ce, out.aux_loss, out.router_logits


@torch.no_grad()
def min_gap(router_logits, k):
    g = float("inf")
    for rl in router_logits:
        p = torch.softmax(rl.float(), dim=-1)
        top = torch.topk(p, k + 1, dim=-1).values
        g = min(g, float((top[:, k - 1] - top[:, k]).min()))
    return g


def lora_grad(d, x, y, out):
    """PEFT 0.17.1: a LoRA adapter (r 4, alpha 8) of q_proj, k_proj, v_proj, o_proj over the frozen
    model (router and experts frozen: the gradient still flows through them to the earlier layers),
    lora_B set nonzero (seeded) so that every A has a gradient too; one loss (CE + coef * aux) and its
    gradient. Writes out/adapter (the adapter, PEFT's save_pretrained) and out/grad (the gradients of
    every lora_A / lora_B as a PEFT adapter directory, f32, PEFT's names)."""
    import shutil
    import peft
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager", pad_token_id=None)
    torch.manual_seed(7)
    pm = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape) * 0.05)
    pm.train()
    params = [(n, p) for n, p in pm.named_parameters() if p.requires_grad]
    assert params and all("lora_" in n for n, _ in params)
    loss, ce, aux, _ = loss_of(pm, x, y)
    loss.backward()
    if os.path.isdir(out):
        shutil.rmtree(out)
    pm.save_pretrained(os.path.join(out, "adapter"))
    readme = os.path.join(out, "adapter", "README.md")
    if os.path.exists(readme):
        os.remove(readme)
    os.makedirs(os.path.join(out, "grad"))
    grads = {n.replace(".default", ""): p.grad.detach().float().contiguous().clone() for n, p in params}
    save_file(grads, os.path.join(out, "grad", "adapter_model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(out, "adapter", "adapter_config.json"), os.path.join(out, "grad", "adapter_config.json"))
    for dd, _, files in os.walk(out):
        for n in files:
            os.chmod(os.path.join(dd, n), 0o644)
    return dict(dir=os.path.basename(out), loss=float(loss.item()), ce=float(ce.item()), aux=float(aux.item()),
                peft=peft.__version__, grad_max_abs=max(float(g.abs().max()) for g in grads.values()))


def run_case(cs, zs, ci, tmp):
    d = os.path.join(tmp, cs["name"])
    sets = dict(AUX)
    sets.update(cs.get("set", {}))
    args = cs["args"] + ["--random-norms", "--set", json.dumps(sets, sort_keys=True)]
    subprocess.run([zs, "init-model"] + args + ["--out", d], check=True, stdout=subprocess.DEVNULL)
    ck = checksum(os.path.join(d, "model.safetensors"))
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager", pad_token_id=None)
    m.train()  # no dropout anywhere (attention_dropout 0, router_jitter_noise 0)
    cfg = m.config
    V, k = cfg.vocab_size, cfg.num_experts_per_tok
    rng = np.random.default_rng(500 + ci)
    tr = torch.tensor(rng.integers(0, V, size=(B, T + 1)), dtype=torch.long)
    x, y = tr[:, :T], tr[:, 1:].clone()
    y[0, 2] = y[1, 0] = y[1, 9] = -1

    # (a) one step's loss and gradients
    m.zero_grad(set_to_none=True)
    loss, ce, aux, rl = loss_of(m, x, y)
    loss.backward()
    gap = min_gap(rl, k)
    assert gap > 1e-5, (cs["name"], "near tie in the routing", gap)
    tensors, vals = [], []
    for ti, (name, p) in enumerate(m.named_parameters()):
        g = p.grad.detach().reshape(-1).double() if p.grad is not None else torch.zeros(p.numel(), dtype=torch.float64)
        n = g.numel()
        full = full_tensor(name)
        am = int(torch.argmax(g.abs()).item())
        rec = dict(name=name, shape=list(p.shape), numel=n, norm=float(g.norm().item()), argmax=am, full=full)
        if p.grad is None:
            rec["grad_none"] = True
        tensors.append(rec)
        vals.append(g.numpy().astype("<f4") if full else
                    np.concatenate([[g[am].item()], g[sample_indices(ti, n)].numpy()]).astype("<f4"))

    # (b) AdamW steps on a smaller batch (experts left without tokens: grad None, skipped)
    m2 = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager", pad_token_id=None)
    m2.train()
    sx = torch.tensor(rng.integers(0, V, size=(SB, ST + 1)), dtype=torch.long)
    xs, ys = sx[:, :ST], sx[:, 1:].clone()
    ys[0, 0] = -1
    opt = torch.optim.AdamW(m2.parameters(), foreach=False, **ADAMW)
    losses, unused, gaps = [], [], []
    for s in range(N_STEPS + 1):
        opt.zero_grad(set_to_none=True)
        l2, _, _, rl2 = loss_of(m2, xs, ys)
        losses.append(float(l2.item()))
        gaps.append(min_gap(rl2, k))
        if s == N_STEPS:
            break
        l2.backward()
        unused.append([n for n, p in m2.named_parameters() if p.grad is None])
        opt.step()
    assert min(gaps) > 1e-5, (cs["name"], "near tie in the steps' routing", gaps)

    lora = lora_grad(d, x, y, os.path.join(HERE, "lora-" + cs["name"])) if cs.get("lora") else None

    ycl = y.tolist()
    rec = dict(name=cs["name"], family=cfg.model_type, init_args=args, safetensors_checksum=ck,
               transformers_class=type(m).__name__, vocab=V, n_experts=getattr(cfg, "num_local_experts", None) or
               cfg.num_experts, top_k=k, router_aux_loss_coef=cfg.router_aux_loss_coef,
               train=dict(B=B, T=T, tokens=x.tolist(), targets=ycl, loss=float(loss.item()), ce=float(ce.item()),
                          aux=float(aux.item()), min_gap=gap, n_sample=N_SAMPLE, tensors=tensors),
               steps=dict(B=SB, T=ST, tokens=xs.tolist(), targets=ys.tolist(), losses=losses, unused=unused,
                          min_gap=min(gaps),
                          adamw=dict(lr=ADAMW["lr"], beta1=ADAMW["betas"][0], beta2=ADAMW["betas"][1],
                                     eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"])))
    if lora:
        rec["lora"] = lora
    print("%-9s loss %.6f (ce %.6f + %.2f x aux %.6f), %d tensors, min gap %.2e; steps %s (min gap %.2e); unused per step %s" % (
        cs["name"], loss.item(), ce.item(), cfg.router_aux_loss_coef, aux.item(), len(tensors), gap,
        " ".join("%.6f" % v for v in losses), min(gaps), [len(u) for u in unused]))
    return rec, vals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zeroserve", default="./zeroserve")
    a = ap.parse_args()
    torch.manual_seed(0)
    recs, blobs = [], []
    with tempfile.TemporaryDirectory(prefix="zs-moegrad-") as tmp:
        for ci, cs in enumerate(cases()):
            rec, vals = run_case(cs, a.zeroserve, ci, tmp)
            recs.append(rec)
            blobs.append(vals)
    off, parts = 0, []
    for rec, vals in zip(recs, blobs):
        for t, v in zip(rec["train"]["tensors"], vals):
            t["offset"] = off
            parts.append(v)
            off += v.size
    np.concatenate(parts).astype("<f4").tofile(os.path.join(HERE, "reference.bin"))
    with open(os.path.join(HERE, "reference.json"), "w") as f:
        json.dump(dict(torch=torch.__version__, transformers=transformers.__version__, cases=recs), f, indent=None,
                  separators=(",", ":"))
        f.write("\n")
    print("wrote %s/reference.{json,bin}: %d floats" % (HERE, off))


if __name__ == "__main__":
    main()
