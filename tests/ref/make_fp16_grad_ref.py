#!/usr/bin/env python3
"""make_fp16_grad_ref.py — the fp16 gradient path of a ZeRO training step with a static loss scale,
computed by PyTorch, for tests/test-train-mp.c (issue 16: mixed precision, fp16 loss scaling).

Model: ../shared/models/stories260K as transformers' LlamaForCausalLM (float32, eager attention,
CPU), its MATRICES (every 2-D tensor: the tied embedding / LM head and the projections) rounded to
fp16 and computed in fp32 from those values; the norm weights stay fp32, as the engine keeps norms
and biases in f32 whatever the weight dtype (model.h). Batch: the two sequences of
tests/ref/stories260K-train.json (tokens, targets; -1 masked), one per rank: 2 ranks x 1
micro-batch of B=1, T=32. Static loss scale S = 1024.

Per rank r: the f32 gradient of its own mean loss (F.cross_entropy, ignore_index=-1, over its
counted targets), times w_r = float32(count_r) / float32(total) (its share of the step's 56 counted
targets) and times S, in fp32; cast to fp16 (round to nearest even). Then the two ranks' fp16
gradients summed in fp32 in rank order and rounded once to fp16 (the comm's reduce-scatter /
all-reduce of fp16). That fp16 gradient is what every shard owner accumulates (in f32) at step 1,
still scaled by S: what the training's gradient hook sees.

The engine's f32 gradients differ from torch's in the last f32 bits (summation order), so a
rank's fp16 cast can land one fp16 ulp (of ITS magnitude) away from torch's, and where the two
ranks' values cancel in the sum that is many ulps of the (small) sum. Hence rank-exp.bin: per
element the fp16 exponent field of the larger of the two ranks' |fp16 gradient|, from which the
test bounds each element by 2 ulp of that magnitude (one per rank) + 1 ulp of the result.

Writes tests/ref/fp16-grad/:
  grad.bin        the fp16 gradient (raw little-endian binary16) of the tensors below, one after
                  another (HF shapes, row-major)
  rank-exp.bin    one byte per element of grad.bin (same order): the biased exponent field (0..30)
                  of max(|fp16 g_0|, |fp16 g_1|), the two ranks' fp16 gradients before the sum
  reference.json  index: S, counts, shares, per tensor {name, shape, offset (in fp16 elements),
                  numel, maxabs (of the scaled fp16 gradient)}, plus the step's loss (fp32)
Tensors: model.embed_tokens.weight (embedding + tied head), model.layers.2.self_attn.q_proj.weight,
model.layers.4.mlp.down_proj.weight, model.layers.1.post_attention_layernorm.weight,
model.norm.weight (48000 elements: 144 KB in all).

Re-run (not part of `make test`; from the repository root):
  python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch==2.9.1 transformers==4.57.3
  ZS_SHARED=../shared /tmp/tv/bin/python tests/ref/make_fp16_grad_ref.py
"""
import json, os

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, 'fp16-grad')
S = 1024.0
TENSORS = ['model.embed_tokens.weight', 'model.layers.2.self_attn.q_proj.weight',
           'model.layers.4.mlp.down_proj.weight', 'model.layers.1.post_attention_layernorm.weight',
           'model.norm.weight']


def model_dir():
    d = os.path.join(os.environ.get('ZS_SHARED', os.path.join(HERE, '..', '..', '..', 'shared')), 'models', 'stories260K')
    assert os.path.isdir(d), d
    return d


def load_model():
    d = model_dir()
    cfg = LlamaConfig.from_pretrained(d)
    cfg._attn_implementation = 'eager'
    m = LlamaForCausalLM(cfg).float().eval()
    sd = load_file(os.path.join(d, 'model.safetensors'))
    # matrices rounded to fp16 (RNE), then computed in fp32; 1-D tensors (norms) stay fp32
    sd = {k: (v.to(torch.float16).to(torch.float32) if v.dim() == 2 else v.to(torch.float32)) for k, v in sd.items()}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert all(k == 'lm_head.weight' for k in missing), missing  # tied to the embedding
    m.tie_weights()
    return m


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ref = json.load(open(os.path.join(HERE, 'stories260K-train.json')))
    tokens, targets = ref['tokens'], ref['targets']
    counts = [sum(1 for x in t if x >= 0) for t in targets]
    total = sum(counts)
    m = load_model()
    params = dict(m.named_parameters())
    per_rank, loss_sum = [], 0.0
    for r in range(2):
        m.zero_grad(set_to_none=True)
        tok = torch.tensor([tokens[r]], dtype=torch.long)
        tgt = torch.tensor([targets[r]], dtype=torch.long)
        logits = m(input_ids=tok).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-1)
        loss.backward()
        loss_sum += float(loss.item()) * counts[r]
        w = np.float32(np.float32(counts[r]) / np.float32(total)) * np.float32(S)  # exact: S is 2^10
        per_rank.append({n: (params[n].grad.detach().float() * float(w)).to(torch.float16) for n in TENSORS})
    os.makedirs(OUT, exist_ok=True)
    blob, exps, index, off = [], [], [], 0
    for n in TENSORS:
        g = (per_rank[0][n].float() + per_rank[1][n].float()).to(torch.float16)  # f32 sum in rank order, one rounding
        a = g.contiguous().numpy().astype('<f2')
        assert np.all(np.isfinite(a)), n
        blob.append(a.tobytes())
        big = np.maximum(np.abs(per_rank[0][n].contiguous().numpy()), np.abs(per_rank[1][n].contiguous().numpy()))
        exps.append(((big.astype('<f2').view('<u2') >> 10) & 0x1f).astype('u1').tobytes())
        index.append({'name': n, 'shape': list(a.shape), 'offset': off, 'numel': int(a.size),
                      'maxabs': float(np.abs(a.astype(np.float32)).max())})
        off += int(a.size)
    with open(os.path.join(OUT, 'grad.bin'), 'wb') as f:
        f.write(b''.join(blob))
    with open(os.path.join(OUT, 'rank-exp.bin'), 'wb') as f:
        f.write(b''.join(exps))
    doc = {
        'generator': 'tests/ref/make_fp16_grad_ref.py (torch %s, transformers %s LlamaForCausalLM, eager, CPU)'
                     % (torch.__version__, __import__('transformers').__version__),
        'model': 'stories260K, matrices rounded to fp16, computed in fp32; norms fp32',
        'batch': 'tests/ref/stories260K-train.json: sequence r on rank r (2 ranks x 1 micro-batch, B=1, T=32)',
        'loss_scale': S, 'counts': counts, 'total': total,
        'loss': loss_sum / total,
        'dtype': 'fp16 little-endian', 'bin': 'grad.bin', 'bin_elems': off, 'rank_exp': 'rank-exp.bin',
        'tensors': index,
        'note': 'per rank: fp16(grad(mean loss_r) * count_r/total * S); then fp16(f32(g_0) + f32(g_1))',
    }
    with open(os.path.join(OUT, 'reference.json'), 'w') as f:
        json.dump(doc, f, indent=1)
        f.write('\n')
    print('loss %.7f; %d fp16 elements; %s' % (doc['loss'], off, ', '.join('%s max %.4g' % (x['name'], x['maxabs']) for x in index)))


if __name__ == '__main__':
    main()
