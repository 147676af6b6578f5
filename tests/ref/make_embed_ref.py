#!/usr/bin/env python3
"""make_embed_ref.py — reference embeddings for tests/test-embeddings.c: stories260K's
LlamaModel (transformers; last_hidden_state is AFTER the final RMSNorm), three inputs tokenized
by the Hugging Face tokenizer with BOS, pooled over the input's tokens (mean, and last token),
then L2-normalised, in float64 from the float32 hidden states. Writes tests/ref/embed-ref.json
(the token ids, the pooled unnormalised vectors and the normalised ones).

Re-run (needs torch + transformers; not needed by `make test`):
    /tmp/tv/bin/python tests/ref/make_embed_ref.py [../shared/models/stories260K] [tests/ref/embed-ref.json]
"""
import json
import os
import sys

import torch
from transformers import AutoTokenizer, LlamaModel

here = os.path.dirname(os.path.abspath(__file__))
model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "..", "shared", "models", "stories260K")
out_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "embed-ref.json")
texts = ["Once upon a time there was a little girl.", "The cat sat on the mat", "Hello"]

tok = AutoTokenizer.from_pretrained(model_dir)
model = LlamaModel.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
cases = []
with torch.no_grad():
    for t in texts:
        ids = tok(t, add_special_tokens=True)["input_ids"]
        if ids[0] != tok.bos_token_id:
            ids = [tok.bos_token_id] + ids
        h = model(torch.tensor([ids])).last_hidden_state[0].double()  # [n, dim], after the final norm
        mean = h.mean(0)
        last = h[-1]
        cases.append({
            "text": t,
            "ids": ids,
            "mean": mean.tolist(),
            "last": last.tolist(),
            "mean_normalized": (mean / mean.norm()).tolist(),
            "last_normalized": (last / last.norm()).tolist(),
        })
with open(out_path, "w") as f:
    json.dump({"model": "stories260K", "dim": len(cases[0]["mean"]), "cases": cases}, f)
print("wrote", out_path)
