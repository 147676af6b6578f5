#!/usr/bin/env python3
"""make_train_ref.py — training reference data for tests/test-grad.c (the backward pass).

For each fixture model (../shared/models/stories260K: Llama with RMSNorm, RoPE rotate_half, GQA,
SwiGLU, tied head; ../shared/models/gpt2-bytes: GPT-2 with LayerNorm, GELU tanh, biases, learned
positions, Conv1D weights [in, out], tied head) this builds the model in plain float32 torch
(CPU), runs one fixed micro-batch (B=2 sequences of T=32 tokens taken from the fixture's
reference.json, the second one reversed, the first 8 targets of sequence 0 masked with -1) and writes

  tests/ref/<model>-train.bin   the gradient of every parameter, float32 little-endian, tensors
                                one after another in safetensors file order, HF names and shapes
  tests/ref/<model>-train.json  index: batch (tokens, targets), loss (mean next-token cross-entropy
                                over targets >= 0), per tensor {name, shape, offset (in floats),
                                numel, norm}, and the losses of 5 torch.optim.AdamW steps on the
                                same batch (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1,
                                every parameter decayed): adamw.losses[k] = loss after k updates,
                                k = 0..5 (losses[0] is the loss above).

Needs Debian's torch and numpy (no PyPI):
  apt-get install -y python3-torch python3-numpy      # torch 1.13.1 on Debian 12
  /usr/bin/python3 tests/ref/make_train_ref.py        # from the repository root
(/usr/bin/python3, since a pyenv python3 earlier in PATH does not see Debian's packages.)
The safetensors files are read by the small parser below (json header + numpy.frombuffer).
"""
import argparse, json, math, os, struct
import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
B, T, MASKED = 2, 32, 8
ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
N_STEPS = 5


def load_safetensors(path):
    """Returns [(name, float32 tensor)] in file (data offset) order."""
    d = open(path, 'rb').read()
    n = struct.unpack('<Q', d[:8])[0]
    hdr = json.loads(d[8:8 + n]); base = 8 + n
    items = sorted(((k, v) for k, v in hdr.items() if k != '__metadata__'), key=lambda kv: kv[1]['data_offsets'][0])
    out = []
    for k, v in items:
        assert v['dtype'] == 'F32', (k, v['dtype'])
        a, b = v['data_offsets']
        out.append((k, torch.from_numpy(np.frombuffer(d[base + a:base + b], dtype='<f4').reshape(v['shape']).copy())))
    return out


# ------------------------------------------------------------------------------------------- llama
def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def llama_forward(W, cfg, ids):
    """ids [B, T] -> logits [B, T, V]."""
    D, H, KV = cfg['hidden_size'], cfg['num_attention_heads'], cfg['num_key_value_heads']
    hd = cfg.get('head_dim') or D // H
    eps, L = cfg['rms_norm_eps'], cfg['num_hidden_layers']
    Bq, Tq = ids.shape
    x = W['model.embed_tokens.weight'][ids]
    inv_freq = 1.0 / (cfg['rope_theta'] ** (torch.arange(0, hd, 2, dtype=torch.int64).to(torch.float32) / hd))
    freqs = torch.arange(Tq, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    causal = torch.full((Tq, Tq), float('-inf')).triu(1)
    for l in range(L):
        p = 'model.layers.%d.' % l
        h = rms_norm(x, W[p + 'input_layernorm.weight'], eps)
        q = (h @ W[p + 'self_attn.q_proj.weight'].T).view(Bq, Tq, H, hd).transpose(1, 2)
        k = (h @ W[p + 'self_attn.k_proj.weight'].T).view(Bq, Tq, KV, hd).transpose(1, 2)
        v = (h @ W[p + 'self_attn.v_proj.weight'].T).view(Bq, Tq, KV, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)     # query head j uses kv head j // (H / KV)
        v = v.repeat_interleave(H // KV, dim=1)
        att = torch.softmax((q @ k.transpose(-1, -2)) * (hd ** -0.5) + causal, dim=-1)
        o = (att @ v).transpose(1, 2).reshape(Bq, Tq, H * hd)
        x = x + o @ W[p + 'self_attn.o_proj.weight'].T
        h = rms_norm(x, W[p + 'post_attention_layernorm.weight'], eps)
        g = h @ W[p + 'mlp.gate_proj.weight'].T
        u = h @ W[p + 'mlp.up_proj.weight'].T
        x = x + (F.silu(g) * u) @ W[p + 'mlp.down_proj.weight'].T
    x = rms_norm(x, W['model.norm.weight'], eps)
    head = W['lm_head.weight'] if 'lm_head.weight' in W else W['model.embed_tokens.weight']
    return x @ head.T


# -------------------------------------------------------------------------------------------- gpt2
def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gpt2_forward(W, cfg, ids):
    """ids [B, T] -> logits [B, T, V]. Conv1D weights are [in, out]: y = x @ W + b."""
    C, H, L = cfg['n_embd'], cfg['n_head'], cfg['n_layer']
    eps = cfg.get('layer_norm_epsilon', 1e-5); hd = C // H
    Bq, Tq = ids.shape
    ln = F.layer_norm
    x = W['transformer.wte.weight'][ids] + W['transformer.wpe.weight'][:Tq]
    causal = torch.full((Tq, Tq), float('-inf')).triu(1)
    for l in range(L):
        p = 'transformer.h.%d.' % l
        h = ln(x, (C,), W[p + 'ln_1.weight'], W[p + 'ln_1.bias'], eps)
        qkv = h @ W[p + 'attn.c_attn.weight'] + W[p + 'attn.c_attn.bias']
        q, k, v = (t.view(Bq, Tq, H, hd).transpose(1, 2) for t in qkv.split(C, dim=-1))
        att = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(hd) + causal, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(Bq, Tq, C)
        x = x + y @ W[p + 'attn.c_proj.weight'] + W[p + 'attn.c_proj.bias']
        h = ln(x, (C,), W[p + 'ln_2.weight'], W[p + 'ln_2.bias'], eps)
        h = gelu_new(h @ W[p + 'mlp.c_fc.weight'] + W[p + 'mlp.c_fc.bias'])
        x = x + h @ W[p + 'mlp.c_proj.weight'] + W[p + 'mlp.c_proj.bias']
    x = ln(x, (C,), W['transformer.ln_f.weight'], W['transformer.ln_f.bias'], eps)
    head = W['lm_head.weight'] if 'lm_head.weight' in W else W['transformer.wte.weight']
    return x @ head.T


# ----------------------------------------------------------------------------------------- the run
def batch_from(ref, model):
    """Two sequences of T+1 ids from the fixture's reference continuations: tokens = [:T], targets = [1:].
    Those continuations are the model's own greedy output (loss near 0), so sequence 1 is reversed to
    give the loss and the gradients some size."""
    cases = ref['cases']
    if len(cases) >= 2:
        seqs = [cases[0]['all_ids'][:T + 1], cases[1]['all_ids'][:T + 1][::-1]]
    else:
        ids = cases[0]['all_ids']
        seqs = [ids[:T + 1], ids[len(ids) - (T + 1):][::-1]]
    tokens = [s[:T] for s in seqs]
    targets = [s[1:T + 1] for s in seqs]
    targets[0] = [-1] * MASKED + targets[0][MASKED:]
    return tokens, targets


def loss_of(fwd, W, cfg, tokens, targets):
    logits = fwd(W, cfg, tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)


def make(model, out_dir):
    mdir = os.path.join(HERE, '..', '..', '..', 'shared', 'models', model)
    if not os.path.isdir(mdir):
        mdir = os.path.join(os.environ.get('ZS_SHARED', '../shared'), 'models', model)
    cfg = json.load(open(os.path.join(mdir, 'config.json')))
    ref = json.load(open(os.path.join(mdir, 'reference.json')))
    fwd = gpt2_forward if cfg['model_type'] == 'gpt2' else llama_forward
    tok_l, tgt_l = batch_from(ref, model)
    tokens = torch.tensor(tok_l, dtype=torch.long)
    targets = torch.tensor(tgt_l, dtype=torch.long)

    def fresh():
        return [(k, torch.nn.Parameter(v.clone())) for k, v in load_safetensors(os.path.join(mdir, 'model.safetensors'))]

    # gradient of one forward/backward
    P = fresh(); W = dict(P)
    loss = loss_of(fwd, W, cfg, tokens, targets)
    loss.backward()
    blob, index, off = [], [], 0
    for name, p in P:
        g = p.grad.detach().contiguous().numpy().astype('<f4')
        blob.append(g.tobytes())
        index.append({'name': name, 'shape': list(g.shape), 'offset': off, 'numel': int(g.size),
                      'norm': float('%.9g' % float(np.linalg.norm(g.astype(np.float64))))})
        off += int(g.size)

    # AdamW steps
    P2 = fresh(); W2 = dict(P2)
    opt = torch.optim.AdamW([p for _, p in P2], **ADAMW)
    losses = []
    for s in range(N_STEPS + 1):
        opt.zero_grad()
        l2 = loss_of(fwd, W2, cfg, tokens, targets)
        losses.append(float(l2.item()))
        if s == N_STEPS:
            break
        l2.backward()
        opt.step()

    bin_name = '%s-train.bin' % model
    with open(os.path.join(out_dir, bin_name), 'wb') as f:
        f.write(b''.join(blob))
    doc = {
        'model': model,
        'generator': 'tests/ref/make_train_ref.py (torch %s, float32, CPU)' % torch.__version__,
        'B': B, 'T': T,
        'tokens': tok_l, 'targets': tgt_l,
        'mask': 'targets of -1 are ignored; loss = mean cross-entropy over the %d targets >= 0'
                % int((targets >= 0).sum()),
        'n_counted': int((targets >= 0).sum()),
        'loss': float(loss.item()),
        'bin': bin_name, 'bin_floats': off,
        'tensors': index,
        'adamw': {'lr': ADAMW['lr'], 'beta1': ADAMW['betas'][0], 'beta2': ADAMW['betas'][1],
                  'eps': ADAMW['eps'], 'weight_decay': ADAMW['weight_decay'], 'steps': N_STEPS,
                  'losses': losses,
                  'note': 'torch.optim.AdamW over every parameter; losses[k] = loss after k updates'},
    }
    with open(os.path.join(out_dir, '%s-train.json' % model), 'w') as f:
        json.dump(doc, f, indent=1)
        f.write('\n')
    print('%s: loss %.7f, %d floats of gradients, AdamW losses %s' % (model, loss.item(), off,
                                                                     ' '.join('%.6f' % x for x in losses)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--models', nargs='*', default=['stories260K', 'gpt2-bytes'])
    ap.add_argument('--out-dir', default=HERE)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    for m in a.models:
        make(m, a.out_dir)


if __name__ == '__main__':
    main()
