"""A LoRA adapter made and saved by PEFT itself, for tests/test-lora.c (the PEFT format both ways).

The base is a small random Llama from `zeroserve init-model` (deterministic by seed; test-lora
regenerates it with the same flags). PEFT wraps it with LoraConfig(r=4, lora_alpha=8, all seven
projections), lora_B is set to random values (PEFT initialises it to zero, which would hide a
wrong B), and save_pretrained writes tests/ref/lora-peft/ (adapter_config.json,
adapter_model.safetensors). The logits of the adapted model on a fixed sequence (full vocab at a
few positions) go to tests/ref/lora-peft/reference.json for the forward pass with adapters.

Re-run (not part of `make test`):
  python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch==2.9.1 transformers==4.57.3 peft==0.17.1
  make zeroserve && /tmp/tv/bin/python tests/ref/make_lora_ref.py
"""
import json, os, shutil, subprocess, sys, tempfile

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

ARGS = ["--arch", "llama", "--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
        "--vocab", "300", "--context", "64", "--seed", "5", "--random-norms"]
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lora-peft")
POS = [0, 5, 17, 31]

def main():
    zs = sys.argv[1] if len(sys.argv) > 1 else "./zeroserve"
    tmp = tempfile.mkdtemp()
    base = os.path.join(tmp, "base")
    subprocess.run([zs, "init-model"] + ARGS + ["--out", base], check=True, stdout=subprocess.DEVNULL)
    m = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32, attn_implementation="eager")
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none",
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    pm = get_peft_model(m, cfg)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    pm.save_pretrained(OUT)
    ids = torch.tensor([[(i * 37 + 11) % 299 for i in range(32)]])
    with torch.no_grad():
        lg = pm(ids).logits[0]
    ref = {"init_model_args": ARGS, "peft": __import__("peft").__version__,
           "ids": ids[0].tolist(), "positions": POS,
           "logits": [[float(x) for x in lg[p].tolist()] for p in POS]}
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f)
    for extra in ("README.md",):  # PEFT writes a model card; the test does not need it
        p = os.path.join(OUT, extra)
        if os.path.exists(p):
            os.remove(p)
    shutil.rmtree(tmp)
    print("wrote", OUT, sorted(os.listdir(OUT)))

if __name__ == "__main__":
    main()
