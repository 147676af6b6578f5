"""One LoRA training step computed by PEFT itself, for tests/test-lora-grad.c (issue 14: "gradients of
one step match").

The base is the small random Llama of tests/ref/lora-peft (its reference.json's init_model_args, made
by `zeroserve init-model`, deterministic by seed; the test regenerates it with the same flags), the
adapter is PEFT's own tests/ref/lora-peft (r 4, alpha 8, all seven projections, nonzero lora_B),
loaded trainable. One fixed batch of B=2 sequences of T=16 tokens (ids below; targets are the next
tokens, a few masked with -1), positions 0..15 in each. The loss is zeroserve's (train.h): the mean
next-token cross-entropy over every counted target of the step (F.cross_entropy with
ignore_index=-1, reduction "mean", over both sequences together). Backward in float32, eager
attention, no dropout, no clipping. Then one torch.optim.AdamW step (foreach=False) over the lora
parameters only: lr 1e-2, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01.

Writes tests/ref/lora-grad/:
  grad/          the gradient of every lora_A / lora_B as a PEFT adapter directory (the adapter's
                 adapter_config.json, adapter_model.safetensors holding the gradients, f32, PEFT's
                 names), so zs_lora_load reads it in the adapter's own layout
  after-step/    the adapter after the AdamW step (PEFT's save_pretrained)
  reference.json init_model_args, tokens, targets, loss, adamw (hyper-parameters), loss_after (the
                 loss of the same batch after the step), peft / torch versions

Re-run (not part of `make test`):
  python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch==2.9.1 transformers==4.57.3 peft==0.17.1
  make -j2 CUDA=0 zeroserve && /tmp/tv/bin/python tests/ref/make_lora_grad_ref.py [./zeroserve]
"""
import json, os, shutil, subprocess, sys, tempfile

import torch
import torch.nn.functional as F
from peft import PeftModel
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ADAPTER = os.path.join(HERE, "lora-peft")
OUT = os.path.join(HERE, "lora-grad")
B, T = 2, 16
ADAMW = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
# sequence b: T + 1 ids; tokens = ids[:T], targets = ids[1:]
IDS = [[(i * 53 + 7 + 101 * b) % 300 for i in range(T + 1)] for b in range(B)]
MASK = [(0, 0), (0, 1), (0, 2), (1, 7), (1, 15)]  # (sequence, position) of targets set to -1


def batch():
    tok = torch.tensor([s[:T] for s in IDS])
    tgt = torch.tensor([s[1:] for s in IDS])
    for b, t in MASK:
        tgt[b, t] = -1
    return tok, tgt


def loss_of(pm, tok, tgt):
    lg = pm(input_ids=tok).logits.float()
    return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), ignore_index=-1, reduction="mean")


def main():
    zs = sys.argv[1] if len(sys.argv) > 1 else "./zeroserve"
    with open(os.path.join(ADAPTER, "reference.json")) as f:
        args = json.load(f)["init_model_args"]
    tmp = tempfile.mkdtemp()
    base = os.path.join(tmp, "base")
    subprocess.run([zs, "init-model"] + args + ["--out", base], check=True, stdout=subprocess.DEVNULL)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32, attn_implementation="eager")
    pm = PeftModel.from_pretrained(m, ADAPTER, is_trainable=True)
    pm.train()  # lora_dropout is 0: train mode changes nothing
    params = [(n, p) for n, p in pm.named_parameters() if p.requires_grad]
    assert params and all("lora_" in n for n, _ in params), [n for n, _ in params]
    tok, tgt = batch()
    loss = loss_of(pm, tok, tgt)
    loss.backward()

    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(os.path.join(OUT, "grad"))
    grads = {n.replace(".default", ""): p.grad.detach().float().contiguous().clone() for n, p in params}
    save_file(grads, os.path.join(OUT, "grad", "adapter_model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(ADAPTER, "adapter_config.json"), os.path.join(OUT, "grad", "adapter_config.json"))

    opt = torch.optim.AdamW([p for _, p in params], foreach=False, **ADAMW)
    opt.step()
    pm.save_pretrained(os.path.join(OUT, "after-step"))
    readme = os.path.join(OUT, "after-step", "README.md")  # PEFT's model card; not needed
    if os.path.exists(readme):
        os.remove(readme)
    with torch.no_grad():
        loss_after = loss_of(pm, tok, tgt)

    gmax = max(float(g.abs().max()) for g in grads.values())
    ref = {"init_model_args": args, "peft": __import__("peft").__version__, "torch": torch.__version__,
           "B": B, "T": T, "tokens": tok.tolist(), "targets": tgt.tolist(),
           "counted": int((tgt >= 0).sum()), "loss": float(loss.detach()), "loss_after": float(loss_after),
           "grad_max_abs": gmax,
           "adamw": {"lr": ADAMW["lr"], "beta1": ADAMW["betas"][0], "beta2": ADAMW["betas"][1],
                     "eps": ADAMW["eps"], "weight_decay": ADAMW["weight_decay"]}}
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    for d, _, files in os.walk(OUT):
        for n in files:
            os.chmod(os.path.join(d, n), 0o644)
    shutil.rmtree(tmp)
    print("wrote", OUT, "loss %.6f -> %.6f, max |grad| %.4g" % (float(loss), float(loss_after), gmax))


if __name__ == "__main__":
    main()
