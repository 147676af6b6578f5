#!/usr/bin/env python3
"""make_ppl_ref.py — reference perplexities for tests/e2e-perplexity.sh (`zeroserve perplexity`).

The same windows as the command (llama.cpp's llama-perplexity method: the text's tokens, BOS first
when the tokenizer adds one, cut into consecutive windows of n_ctx tokens, each window's first
token replaced by BOS and the window evaluated on its own from position 0, the logits at positions
n_ctx/2 .. n_ctx-2 scoring the next token; with --stride S, windows every S tokens scoring their
last S tokens), computed by independent implementations:

  torch      transformers' LlamaForCausalLM / GPT2LMHeadModel loaded from the fixture folders
             (float32 on the CPU, one full causal forward per window), text encoded by the
             `tokenizers` package from tokenizer.json; NLL = -log_softmax in float64.
  llama.cpp  llama-cpp-python (llama.cpp's own evaluation, logits_all=True, f32 KV cache) on
             stories260K.gguf, text encoded by llama.cpp's tokenizer; NLL in float64 (numpy).

Writes tests/ref/ppl-ref.json (every case: arguments, tokens, windows, scored tokens, mean NLL,
perplexity, per-window mean NLL) and tests/ref/ppl-ref.tsv (the lines the shell test reads). Each
run replaces its own backend's cases and keeps the other's. `make test` needs neither Python nor
these packages; rerun this only to regenerate the data:

  python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch==2.9.1 transformers==4.57.3
  /tmp/tv/bin/python tests/ref/make_ppl_ref.py torch          # from the repository root
  /tmp/lcp/bin/python tests/ref/make_ppl_ref.py llama.cpp     # a venv with llama-cpp-python==0.3.16 numpy

(versions used for the committed data: torch 2.9.1, transformers 4.57.3, tokenizers 0.22.2;
llama-cpp-python 0.3.16, numpy 2.4.6). ZS_SHARED points at the fixtures (default ../shared).
"""
import json, math, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.environ.get('ZS_SHARED', os.path.join(HERE, '..', '..', '..', 'shared'))
DEFAULT_CAP = 2048  # the command's default window cap (server/perplexity-cmd.c)

# name, model (under SHARED), text (under tests/ref), arguments of `zeroserve perplexity`
TORCH_CASES = [
    ('s-default', 'models/stories260K', 'ppl-story.txt', ''),
    ('s-ctx64', 'models/stories260K', 'ppl-story.txt', '--context 64'),
    ('s-ctx64-stride16', 'models/stories260K', 'ppl-story.txt', '--context 64 --stride 16'),
    ('s-ctx48-max150', 'models/stories260K', 'ppl-story.txt', '--context 48 --max-tokens 150'),
    ('g-default', 'models/gpt2-bytes', 'ppl-shakespeare.txt', ''),
    ('g-ctx100-stride30', 'models/gpt2-bytes', 'ppl-shakespeare.txt', '--context 100 --stride 30'),
]
LCPP_CASES = [
    ('l-default', 'models/stories260K/stories260K.gguf', 'ppl-story.txt', ''),
    ('l-ctx64', 'models/stories260K/stories260K.gguf', 'ppl-story.txt', '--context 64'),
    ('l-ctx64-stride16', 'models/stories260K/stories260K.gguf', 'ppl-story.txt', '--context 64 --stride 16'),
]


def parse_args(args):
    a = args.split()
    d = {'context': 0, 'stride': 0, 'max-tokens': 0}
    for i in range(0, len(a), 2):
        d[a[i][2:]] = int(a[i + 1])
    return d


def windows(n_tokens, model_ctx, o):
    """(n_ctx, [(start, first, last)]): the scored logits positions first..last of each window."""
    n = n_tokens if not o['max-tokens'] else min(n_tokens, o['max-tokens'])
    n_ctx = o['context'] or min(DEFAULT_CAP, model_ctx, n)
    s = o['stride']
    assert 3 <= n_ctx <= n and s < n_ctx
    if s:
        return n, n_ctx, [(w * s, n_ctx - s - 1, n_ctx - 2) for w in range((n - n_ctx) // s + 1)]
    return n, n_ctx, [(w * n_ctx, n_ctx // 2, n_ctx - 2) for w in range(n // n_ctx)]


def score(ids, bos, model_ctx, args, logits_of):
    """logits_of(window ids) -> float64 array [n_ctx, vocab] of log-probabilities."""
    o = parse_args(args)
    n_used, n_ctx, wins = windows(len(ids), model_ctx, o)
    total, count, per_window = 0.0, 0, []
    for start, first, last in wins:
        w = list(ids[start:start + n_ctx])
        if bos is not None:
            w[0] = bos
        lp = logits_of(w)
        nll = [-float(lp[k][ids[start + k + 1]]) for k in range(first, last + 1)]
        per_window.append(math.fsum(nll) / len(nll))
        for v in nll:  # text order, like the command
            total += v
        count += len(nll)
    mean = total / count
    return {'tokens_in_text': len(ids), 'context': n_ctx, 'stride': o['stride'], 'bos': bos is not None,
            'windows': len(wins), 'scored': count, 'mean_nll': mean, 'perplexity': math.exp(mean),
            'window_nll': per_window}


def run_torch():
    import torch
    import transformers
    import tokenizers
    from transformers import AutoModelForCausalLM
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)
    out, models = [], {}
    for name, model, text, args in TORCH_CASES:
        mdir = os.path.join(SHARED, model)
        if model not in models:
            m = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32).eval()
            tk = tokenizers.Tokenizer.from_file(os.path.join(mdir, 'tokenizer.json'))
            cfg = json.load(open(os.path.join(mdir, 'config.json')))
            models[model] = (m, tk, cfg.get('max_position_embeddings') or cfg['n_positions'])
        m, tk, ctx = models[model]
        pre = tk.encode('', add_special_tokens=True).ids
        bos = pre[0] if pre else None
        body = tk.encode(open(os.path.join(HERE, text), encoding='utf-8').read(), add_special_tokens=False).ids
        ids = ([bos] if bos is not None else []) + body

        def logits_of(w):
            lg = m(torch.tensor([w], dtype=torch.long)).logits[0]
            return torch.log_softmax(lg.to(torch.float64), dim=-1).numpy()
        r = score(ids, bos, ctx, args, logits_of)
        out.append(dict(name=name, backend='torch', model=model, text=text, args=args, **r))
        print(name, r['windows'], r['scored'], r['mean_nll'], file=sys.stderr)
    ver = 'torch %s, transformers %s, tokenizers %s (float32, CPU)' % (torch.__version__, transformers.__version__,
                                                                      tokenizers.__version__)
    return out, ver


def run_llama_cpp():
    import numpy as np
    import llama_cpp
    out, llms = [], {}
    for name, model, text, args in LCPP_CASES:
        path = os.path.join(SHARED, model)
        if model not in llms:
            llms[model] = llama_cpp.Llama(model_path=path, n_ctx=0, n_batch=2048, n_ubatch=2048, logits_all=True,
                                          type_k=0, type_v=0, flash_attn=False, n_threads=2, verbose=False)
        llm = llms[model]
        ctx = llm.n_ctx()
        raw = open(os.path.join(HERE, text), encoding='utf-8').read().encode('utf-8')
        ids = llm.tokenize(raw, add_bos=True, special=False)
        bos = llm.token_bos() if ids and ids[0] == llm.token_bos() else None

        def logits_of(w):
            llm.reset()
            llm.eval(w)
            lg = np.array(llm.scores[:len(w)], dtype=np.float64)
            mx = lg.max(axis=1, keepdims=True)
            return lg - mx - np.log(np.exp(lg - mx).sum(axis=1, keepdims=True))
        r = score(ids, bos, ctx, args, logits_of)
        out.append(dict(name=name, backend='llama.cpp', model=model, text=text, args=args, **r))
        print(name, r['windows'], r['scored'], r['mean_nll'], file=sys.stderr)
    return out, 'llama-cpp-python %s (llama.cpp CPU, f32 KV cache, logits_all)' % llama_cpp.__version__


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ('torch', 'llama.cpp'):
        sys.exit('usage: make_ppl_ref.py torch|llama.cpp')
    backend = sys.argv[1]
    jpath = os.path.join(HERE, 'ppl-ref.json')
    doc = json.load(open(jpath)) if os.path.exists(jpath) else {'generators': {}, 'cases': []}
    cases, ver = run_torch() if backend == 'torch' else run_llama_cpp()
    doc['generators'][backend] = ver
    doc['cases'] = [c for c in doc['cases'] if c['backend'] != backend] + cases
    doc['cases'].sort(key=lambda c: (c['backend'] != 'torch', c['name']))
    doc['method'] = ('llama.cpp llama-perplexity: windows of n_ctx tokens, BOS as each window\'s first token, '
                     'logits at n_ctx/2..n_ctx-2 scored; --stride S: windows every S tokens, last S scored')
    with open(jpath, 'w') as f:
        json.dump(doc, f, indent=1)
        f.write('\n')
    with open(os.path.join(HERE, 'ppl-ref.tsv'), 'w') as f:
        f.write('# written by make_ppl_ref.py from ppl-ref.json: name backend model text tokens_in_text windows '
                'scored mean_nll args\n')
        for c in doc['cases']:
            f.write('%s\t%s\t%s\t%s\t%d\t%d\t%d\t%.17g\t%s\n' % (c['name'], c['backend'], c['model'], c['text'],
                    c['tokens_in_text'], c['windows'], c['scored'], c['mean_nll'], c['args']))


if __name__ == '__main__':
    main()
