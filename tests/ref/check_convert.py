#!/usr/bin/env python3
"""Independent check of `zeroserve convert` against llama.cpp (not run by `make test`).

For each file type it converts a Hugging Face model directory with ./zeroserve, then
  1. reads the GGUF with the `gguf` package (gguf.GGUFReader) and checks the metadata keys and
     every tensor's bytes against a reconstruction done here from model.safetensors with numpy:
     llama.cpp's tensor names, Q/K rows permuted as convert_hf_to_gguf.py's LlamaModel.permute
     does (llama, mistral), GPT-2's Conv1D weights transposed and fused, Phi-3's qkv_proj and
     gate_up_proj kept fused, Gemma's norms + 1, Llama 3's rope_freqs and Phi-3's LongRoPE factors
     (qwen2, qwen3, gemma2, gemma3, phi3 and llama/mistral with RoPE scaling), F16/BF16 with numpy and the
     gguf package, and every block format quantized by ggml itself (ggml_quantize_chunk from the
     libggml-base that llama-cpp-python bundles, through ctypes) in the type the file holds;
  2. loads the file with llama-cpp-python (llama_cpp.Llama(model_path=..., logits_all=True), f32
     KV cache), tokenizes the prompt (compared with the `tokenizers` package on tokenizer.json),
     runs greedy decoding and compares the generated ids, and the logits of every generated
     position in the same context (a teacher-forced pass over zeroserve's ids), with
     `zeroserve generate --model FILE.gguf --temperature 0 --ignore-eos --print-ids --logits-out`;
  3. for the 16-bit and block types, also against llama.cpp on a copy of the file whose tensors
     the gguf package dequantized to F32: llama.cpp's own F16/quantized matrix products round the
     activations (to F16, Q8_0, Q8_K), zeroserve's do not, so that copy is where the two
     computations are the same arithmetic (|diff| must stay under 1e-3; 3e-2 for GPT-2 and Gemma, whose GELU
     ggml computes through an f16 table: the f32 file already differs by a few 1e-3 there).
  4. with --converter-python (a Python with torch and transformers), each f32/f16/bf16/q8_0 file
     against the one llama.cpp's own convert_hf_to_gguf.py (the copy llama-cpp-python installs)
     writes from the same directory, vocabulary left out: every key but general.* and tokenizer.*,
     every tensor byte for byte; the deliberate differences are listed as notes (keys llama.cpp reads
     for every architecture that the converter writes only for some: a RoPE scaling it would drop,
     Gemma 2's rope.freq_base; Llama 3's factors from rope_scaling's original context).
Failing: tensor bytes, metadata or prompt ids that differ, greedy ids that differ at f32, or a
difference over 1e-3 in 3. (At the other types a greedy divergence is reported with llama.cpp's
top-two margin there: its rounding of the activations can flip a near tie.)

Usage (from the repository root, after `make zeroserve`):
  /tmp/lcp/bin/python tests/ref/check_convert.py [--model DIR] [--dtypes f32,f16,q8_0,q4_0,q4_k_m]
      [--prompt TEXT] [--tokens N] [--zeroserve ./zeroserve] [--keep DIR] [--converter-python /tmp/tv/bin/python]
  e.g. for a newer family:  ./zeroserve init-model --arch gemma3 --random-norms --out /tmp/g3 &&
      /tmp/lcp/bin/python tests/ref/check_convert.py --model /tmp/g3 --dtypes f32,f16,bf16,q8_0 \\
      --converter-python /tmp/tv/bin/python
Needs numpy, gguf, tokenizers and llama-cpp-python. Prints one line per file type; exits 1 when a
check fails.
"""
import argparse
import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as QT
import gguf.quants

import llama_cpp
import tokenizers

LIB = os.path.join(os.path.dirname(llama_cpp.__file__), 'lib', 'libggml-base.so')


def ggml_lib():
    lib = ctypes.CDLL(LIB)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    return lib


def encode(lib, qtype, w):
    """w (rows x cols, f32) in the GGUF type qtype, as bytes."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if qtype == QT.F32:
        return w.view(np.uint8).reshape(-1)
    if qtype in (QT.F16, QT.BF16):
        return np.asarray(gguf.quants.quantize(w, qtype)).view(np.uint8).reshape(-1)
    rows, cols = w.shape if w.ndim == 2 else (1, w.shape[0])
    lib.ggml_quantize_init(int(qtype))
    out = np.zeros(lib.ggml_row_size(int(qtype), cols) * rows, dtype=np.uint8)
    lib.ggml_quantize_chunk(int(qtype), w.ctypes.data, out.ctypes.data, 0, rows, cols, None)
    return out


def load_safetensors(d):
    """model.safetensors (single file) as name -> float32 array."""
    raw = open(os.path.join(d, 'model.safetensors'), 'rb').read()
    n = struct.unpack('<Q', raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == '__metadata__':
            continue
        st_dtypes[k] = v['dtype']
        s, e = v['data_offsets']
        b = raw[8 + n + s:8 + n + e]
        if v['dtype'] == 'F32':
            a = np.frombuffer(b, dtype='<f4')
        elif v['dtype'] == 'F16':
            a = np.frombuffer(b, dtype='<f2').astype(np.float32)
        elif v['dtype'] == 'BF16':
            a = (np.frombuffer(b, dtype='<u2').astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit('unsupported dtype ' + v['dtype'])
        out[k] = a.reshape(v['shape'])
    return out


st_dtypes = {}  # safetensors name -> dtype (load_safetensors)


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute (rotate_half rows -> interleaved rows)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_tensors(cfg, st):
    """llama.cpp name -> f32 array (our row-major [out, in] / GGUF reversed), from the HF tensors."""
    out = {}
    if cfg.get('model_type') == 'gpt2':
        pre = 'transformer.' if 'transformer.wte.weight' in st else ''
        out['token_embd.weight'] = st[pre + 'wte.weight']
        out['position_embd.weight'] = st[pre + 'wpe.weight']
        for l in range(cfg['n_layer']):
            p, g = '%sh.%d.' % (pre, l), 'blk.%d.' % l
            for hf, gg in (('ln_1', 'attn_norm'), ('ln_2', 'ffn_norm')):
                out[g + gg + '.weight'] = st[p + hf + '.weight']
                out[g + gg + '.bias'] = st[p + hf + '.bias']
            for hf, gg in (('attn.c_attn', 'attn_qkv'), ('attn.c_proj', 'attn_output'), ('mlp.c_fc', 'ffn_up'),
                           ('mlp.c_proj', 'ffn_down')):
                out[g + gg + '.weight'] = st[p + hf + '.weight'].T
                out[g + gg + '.bias'] = st[p + hf + '.bias']
        out['output_norm.weight'] = st[pre + 'ln_f.weight']
        out['output_norm.bias'] = st[pre + 'ln_f.bias']
        if 'lm_head.weight' in st and not cfg.get('tie_word_embeddings', True):
            out['output.weight'] = st['lm_head.weight']
        return out
    mt = cfg.get('model_type')
    perm = mt in ('llama', 'mistral')  # llama.cpp's llama architecture: Q/K rows interleaved
    gemma = mt in ('gemma2', 'gemma3_text', 'gemma3')
    H, KV = cfg['num_attention_heads'], cfg.get('num_key_value_heads', cfg['num_attention_heads'])
    out['token_embd.weight'] = st['model.embed_tokens.weight']
    for l in range(cfg['num_hidden_layers']):
        p, g = 'model.layers.%d.' % l, 'blk.%d.' % l
        m = {'input_layernorm.weight': 'attn_norm.weight',
             'post_attention_layernorm.weight': 'post_attention_norm.weight' if gemma else 'ffn_norm.weight',
             'pre_feedforward_layernorm.weight': 'ffn_norm.weight',
             'post_feedforward_layernorm.weight': 'post_ffw_norm.weight',
             'self_attn.q_norm.weight': 'attn_q_norm.weight', 'self_attn.k_norm.weight': 'attn_k_norm.weight',
             'self_attn.q_proj.weight': 'attn_q.weight', 'self_attn.k_proj.weight': 'attn_k.weight',
             'self_attn.v_proj.weight': 'attn_v.weight', 'self_attn.o_proj.weight': 'attn_output.weight',
             'self_attn.qkv_proj.weight': 'attn_qkv.weight',  # Phi-3: kept fused
             'self_attn.q_proj.bias': 'attn_q.bias', 'self_attn.k_proj.bias': 'attn_k.bias',
             'self_attn.v_proj.bias': 'attn_v.bias', 'self_attn.o_proj.bias': 'attn_output.bias',
             'mlp.gate_proj.weight': 'ffn_gate.weight', 'mlp.up_proj.weight': 'ffn_up.weight',
             'mlp.gate_up_proj.weight': 'ffn_up.weight', 'mlp.down_proj.weight': 'ffn_down.weight'}
        for hf, gg in m.items():
            if p + hf not in st:
                continue
            w = st[p + hf]
            if perm and hf.startswith('self_attn.q_proj'):
                w = permute(w, H)
            if perm and hf.startswith('self_attn.k_proj'):
                w = permute(w, KV)
            if gemma and hf.endswith('norm.weight'):
                w = norm_plus_one(w, st_dtypes.get(p + hf))
            out[g + gg] = w
    out['output_norm.weight'] = st['model.norm.weight']
    if gemma:
        out['output_norm.weight'] = norm_plus_one(out['output_norm.weight'], st_dtypes.get('model.norm.weight'))
    if not cfg.get('tie_word_embeddings', gemma) and 'lm_head.weight' in st and mt != 'gemma2':
        out['output.weight'] = st['lm_head.weight']
    rs = cfg.get('rope_scaling') or {}
    if rs.get('rope_type', rs.get('type')) == 'llama3':  # LlamaModel.generate_extra_tensors, in float32
        f32 = np.float32
        hd = cfg.get('head_dim') or cfg['hidden_size'] // H
        freqs = f32(1.0) / np.power(f32(cfg.get('rope_theta', 10000.0)), np.arange(0, hd, 2, dtype=f32) / f32(hd))
        old = rs['original_max_position_embeddings']
        lw, hw = f32(old / rs['low_freq_factor']), f32(old / rs['high_freq_factor'])
        fac = []
        for fr in freqs:
            wl = f32(2 * np.pi) / fr
            if wl < hw:
                fac.append(f32(1))
            elif wl > lw:
                fac.append(f32(rs['factor']))
            else:
                sm = (f32(old) / wl - f32(rs['low_freq_factor'])) / f32(rs['high_freq_factor'] - rs['low_freq_factor'])
                fac.append(f32(1) / ((f32(1) - sm) / f32(rs['factor']) + sm))
        out['rope_freqs.weight'] = np.array(fac, dtype=f32)
    if rs.get('rope_type', rs.get('type')) in ('longrope', 'su'):
        out['rope_factors_long.weight'] = np.array(rs['long_factor'], dtype=np.float32)
        out['rope_factors_short.weight'] = np.array(rs['short_factor'], dtype=np.float32)
    return out


def norm_plus_one(w, dtype):
    """Gemma's norms + 1 as convert_hf_to_gguf.py adds it: in f16 for an F16 checkpoint (torch), in f32
    otherwise (a BF16 one is turned into f32 first)."""
    if dtype == 'F16':
        return (w.astype(np.float16) + np.float16(1)).astype(np.float32)
    return w + np.float32(1)


def field(r, k):
    f = r.fields.get(k)
    return None if f is None else f.contents()


def check_file(lib, path, d, cfg, st, errs):
    r = GGUFReader(path)
    arch = field(r, 'general.architecture')
    want_arch = {'gpt2': 'gpt2', 'qwen2': 'qwen2', 'qwen3': 'qwen3', 'gemma2': 'gemma2', 'gemma3_text': 'gemma3',
                 'phi3': 'phi3'}.get(cfg.get('model_type'), 'llama')
    if arch != want_arch:
        errs.append('general.architecture %r, expected %r' % (arch, want_arch))
    if cfg.get('model_type') == 'gpt2':
        keys = {'gpt2.block_count': cfg['n_layer'], 'gpt2.embedding_length': cfg['n_embd'],
                'gpt2.attention.head_count': cfg['n_head'], 'gpt2.context_length': cfg['n_positions']}
    else:
        hd = cfg.get('head_dim') or cfg['hidden_size'] // cfg['num_attention_heads']
        keys = {arch + '.block_count': cfg['num_hidden_layers'], arch + '.embedding_length': cfg['hidden_size'],
                arch + '.feed_forward_length': cfg['intermediate_size'],
                arch + '.attention.head_count': cfg['num_attention_heads'],
                arch + '.attention.head_count_kv': cfg.get('num_key_value_heads', cfg['num_attention_heads']),
                arch + '.context_length': cfg['max_position_embeddings']}
        if arch in ('llama', 'phi3'):  # LlamaModel, Phi3MiniModel; the others leave it to llama.cpp (head_dim)
            keys[arch + '.rope.dimension_count'] = hd
        eps = field(r, arch + '.attention.layer_norm_rms_epsilon')
        if eps is None or abs(eps - cfg['rms_norm_eps']) > 1e-12:
            errs.append('layer_norm_rms_epsilon %r' % eps)
    for k, v in keys.items():
        if field(r, k) != v:
            errs.append('%s = %r, expected %r' % (k, field(r, k), v))
    tok = json.load(open(os.path.join(d, 'tokenizer.json'), encoding='utf-8'))
    toks = field(r, 'tokenizer.ggml.tokens')
    rev = {v: k for k, v in tok['model']['vocab'].items()}
    rev.update({a['id']: a['content'] for a in tok.get('added_tokens', [])})
    n_vocab = cfg['vocab_size']
    if len(toks) != n_vocab:
        errs.append('%d tokens, vocab_size %d' % (len(toks), n_vocab))
    for i, t in enumerate(toks):
        want = rev.get(i, '[PAD%d]' % i)
        if t != want:
            errs.append('token %d is %r, tokenizer.json has %r' % (i, t, want))
            break
    exp = expected_tensors(cfg, st)
    got = {t.name: t for t in r.tensors}
    if set(got) != set(exp):
        errs.append('tensor names differ: extra %s, missing %s' % (sorted(set(got) - set(exp)), sorted(set(exp) - set(got))))
    n_eq, types = 0, {}
    for name, t in got.items():
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        if name not in exp:
            continue
        w = exp[name]
        if list(reversed([int(x) for x in t.shape])) != list(w.shape if w.ndim == 2 else [w.shape[0]]) and \
           [int(x) for x in t.shape] != [w.shape[-1]] + ([w.shape[0]] if w.ndim == 2 else []):
            errs.append('%s shape %s vs %s' % (name, list(t.shape), w.shape))
            continue
        want = encode(lib, t.tensor_type, w)
        have = np.asarray(t.data).view(np.uint8).reshape(-1)
        if want.size == have.size and np.array_equal(want, have):
            n_eq += 1
        else:
            errs.append('%s (%s): bytes differ from the reconstruction' % (name, t.tensor_type.name))
    return n_eq, len(got), types


def dequantized_copy(src, dst):
    """The same file with every tensor dequantized to F32 by the gguf package: the key/values are
    copied as serialized (GGUFReader's field parts; gguf.GGUFWriter refuses empty arrays such as
    a vocabulary without merges), tensor infos and data written here."""
    r = GGUFReader(src)
    kvs = [f for k, f in r.fields.items() if not k.startswith('GGUF.')]
    align = 32
    if 'general.alignment' in r.fields:
        align = int(r.fields['general.alignment'].contents())
    out = bytearray(b'GGUF' + struct.pack('<IQQ', 3, len(r.tensors), len(kvs)))
    for f in kvs:
        out += b''.join(np.asarray(p).tobytes() for p in f.parts)
    datas, off = [], 0
    for t in r.tensors:
        a = np.ascontiguousarray(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), dtype='<f4').tobytes()
        name = t.name.encode()
        out += struct.pack('<Q', len(name)) + name + struct.pack('<I', len(t.shape))
        out += b''.join(struct.pack('<Q', int(x)) for x in t.shape) + struct.pack('<IQ', 0, off)
        datas.append(a)
        off += (len(a) + align - 1) // align * align
    out += b'\0' * (-len(out) % align)
    for a in datas:
        out += a + b'\0' * (-len(a) % align)
    open(dst, 'wb').write(out)


def zeroserve_run(zs, path, prompt, n, tmp):
    lp = os.path.join(tmp, 'logits.bin')
    p = subprocess.run([zs, 'generate', '--model', path, '--prompt', prompt, '--max-tokens', str(n), '--temperature',
                        '0', '--ignore-eos', '--print-ids', '--logits-out', lp],
                       capture_output=True, text=True,
                       # the exact f32-activation path (the default multiplies quantized weights by 8-bit
                       # activations), the arithmetic of llama.cpp on the dequantized copy in 3.
                       env=dict(os.environ, ZS_LOG='warn', ZS_DEVICE='cpu', ZS_QUANT_ACT='f32'))
    if p.returncode != 0:
        raise SystemExit('zeroserve generate failed: ' + p.stderr)
    ids = [int(x) for x in p.stderr.strip().splitlines()[-1].split()]
    logits = np.fromfile(lp, dtype=np.float32)
    return ids, logits.reshape(len(ids), -1)


def llama_run(path, prompt_ids, n, forced):
    """Greedy ids and their logits rows from llama.cpp, and the rows of a teacher-forced pass over
    prompt + forced (zeroserve's ids), so that every position is compared in the same context."""
    m = llama_cpp.Llama(model_path=path, logits_all=True, verbose=False, n_ctx=max(64, len(prompt_ids) + n + 8),
                        n_threads=2, seed=0, type_k=0, type_v=0, flash_attn=False)  # f32 KV cache
    m.reset()
    m.eval(prompt_ids)
    ids, rows = [], []
    for _ in range(n):
        row = np.array(m.scores[m.n_tokens - 1], dtype=np.float32)
        nxt = int(np.argmax(row))
        rows.append(row)
        ids.append(nxt)
        m.eval([nxt])
    m.reset()
    m.eval(prompt_ids + forced[:-1])
    frows = np.array(m.scores[len(prompt_ids) - 1:len(prompt_ids) - 1 + len(forced)], dtype=np.float32)
    tk = m.tokenize(PROMPT.encode(), add_bos=True, special=False)
    m.close()
    return ids, np.array(rows), frows, tk


CONVERTER_RUNNER = r"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("convert_hf_to_gguf", sys.argv[1])
m = importlib.util.module_from_spec(spec)
sys.modules["convert_hf_to_gguf"] = m
spec.loader.exec_module(m)
for cls in list(m.ModelBase._model_classes[m.ModelType.TEXT].values()):
    cls.set_vocab = lambda self: None  # the vocabulary is compared elsewhere (and needs sentencepiece)
    cls._create_vocab_sentencepiece = lambda self: ([None] * self.hparams["vocab_size"], None, None)
sys.argv = ["convert_hf_to_gguf.py", sys.argv[2], "--outfile", sys.argv[3], "--outtype", sys.argv[4]]
m.main()
"""
MISTRAL_STUBS = {"base.py": "class TokenizerVersion: pass\n", "multimodal.py": "DATASET_MEAN = 0\nDATASET_STD = 1\n",
                 "tekken.py": "class Tekkenizer: pass\n", "sentencepiece.py": "class SentencePieceTokenizer: pass\n"}


def run_converter(py, script, model, out, outtype, tmp):
    """llama.cpp's own convert_hf_to_gguf.py (a Python with torch: py) on the model directory, the
    vocabulary left out; mistral_common (which it imports) stubbed, gguf from this interpreter."""
    stub = os.path.join(tmp, 'pystub')
    if not os.path.isdir(stub):
        d = os.path.join(stub, 'mistral_common', 'tokens', 'tokenizers')
        os.makedirs(d)
        for dd in (os.path.join(stub, 'mistral_common'), os.path.join(stub, 'mistral_common', 'tokens'), d):
            open(os.path.join(dd, '__init__.py'), 'w').close()
        for k, v in MISTRAL_STUBS.items():
            open(os.path.join(d, k), 'w').write(v)
        os.symlink(os.path.dirname(gguf.__file__), os.path.join(stub, 'gguf'))
        open(os.path.join(stub, 'run_converter.py'), 'w').write(CONVERTER_RUNNER)
    p = subprocess.run([py, os.path.join(stub, 'run_converter.py'), script, model, out, outtype], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=stub, NO_LOCAL_GGUF='1'))
    if p.returncode != 0:
        raise SystemExit('convert_hf_to_gguf.py failed: ' + p.stderr[-2000:])


def deliberate(cfg, what, name):
    """Why a difference from convert_hf_to_gguf.py's file is deliberate (None: it is not): keys that
    llama.cpp reads for every architecture but the converter writes only for some (a RoPE scaling it
    would otherwise lose, Gemma 2's rope base), and Llama 3's factors computed from rope_scaling's
    original_max_position_embeddings where the converter reads a top-level key (default 8192)."""
    arch = name.split('.')[0]
    rs = cfg.get('rope_scaling') or {}
    if what == 'key' and name == arch + '.rope.freq_base' and cfg.get('model_type') == 'gemma2':
        return 'Gemma2Model writes no rope.freq_base (llama.cpp: 10000)'
    if what == 'key' and '.rope.scaling.' in name and rs:
        return 'the converter writes no %s RoPE scaling for %s (llama.cpp reads the keys)' % (
            rs.get('rope_type', rs.get('type')), cfg.get('model_type'))
    if what == 'tensor' and name == 'rope_freqs.weight' and cfg.get('original_max_position_embeddings', 8192) != \
            rs.get('original_max_position_embeddings'):
        return "the converter's Llama 3 factors use a top-level original_max_position_embeddings (default 8192)"
    return None


def compare_with_converter(ours, theirs, cfg, errs, notes):
    a, b = GGUFReader(ours), GGUFReader(theirs)
    def kv(r):
        return {k: (list(f.types), f.contents()) for k, f in r.fields.items()
                if not k.startswith(('GGUF.', 'tokenizer.', 'general.'))}
    ka, kb = kv(a), kv(b)
    for k in sorted(set(ka) | set(kb)):
        if ka.get(k) != kb.get(k):
            msg = 'key %s: ours %s, convert_hf_to_gguf.py %s' % (k, ka.get(k), kb.get(k))
            why = deliberate(cfg, 'key', k)
            (notes if why else errs).append(msg + (' (%s)' % why if why else ''))
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    if set(ta) != set(tb):
        errs.append('tensors only in ours %s, only in convert_hf_to_gguf.py\'s %s' % (sorted(set(ta) - set(tb)),
                                                                                     sorted(set(tb) - set(ta))))
    n = 0
    for k in sorted(set(ta) & set(tb)):
        x, y = ta[k], tb[k]
        same = x.tensor_type == y.tensor_type and list(x.shape) == list(y.shape) and \
            np.array_equal(np.asarray(x.data).view(np.uint8), np.asarray(y.data).view(np.uint8))
        if same:
            n += 1
            continue
        msg = 'tensor %s: %s %s vs %s %s' % (k, x.tensor_type.name, list(x.shape), y.tensor_type.name, list(y.shape))
        why = deliberate(cfg, 'tensor', k)
        (notes if why else errs).append(msg + (' (%s)' % why if why else ''))
    return n, len(tb)


def main():
    global PROMPT
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', default='../shared/models/stories260K')
    ap.add_argument('--dtypes', default='f32,f16,q8_0,q4_0,q4_k_m')
    ap.add_argument('--prompt', default='Once upon a time')
    ap.add_argument('--tokens', type=int, default=48)
    ap.add_argument('--zeroserve', default='./zeroserve')
    ap.add_argument('--keep', default=None, help='directory for the GGUF files (default: a temporary one)')
    ap.add_argument('--converter-python', default=None,
                    help='a Python with torch (e.g. /tmp/tv/bin/python): also compare every f32/f16/bf16/q8_0 file '
                         "with llama.cpp's own convert_hf_to_gguf.py output, key by key and byte by byte")
    ap.add_argument('--converter', default=os.path.join(os.path.dirname(os.path.dirname(llama_cpp.__file__)), 'bin',
                                                        'convert_hf_to_gguf.py'))
    a = ap.parse_args()
    PROMPT = a.prompt
    cfg = json.load(open(os.path.join(a.model, 'config.json')))
    st = load_safetensors(a.model)
    lib = ggml_lib()
    hf = tokenizers.Tokenizer.from_file(os.path.join(a.model, 'tokenizer.json'))
    hf_ids = hf.encode(a.prompt).ids
    tmp = a.keep or tempfile.mkdtemp(prefix='zs-check-convert-')
    os.makedirs(tmp, exist_ok=True)
    base_ids, base_logits = zeroserve_run(a.zeroserve, a.model, a.prompt, a.tokens, tmp)
    failed = False
    # GPT-2: ggml's CPU GELU reads an f16 table, a few 1e-3 in the logits (see f32); the rest 1e-3
    tol = 3e-2 if cfg.get('model_type') in ('gpt2', 'gemma2', 'gemma3_text') else 1e-3  # GELU: as above
    print('model %s, prompt %r (tokenizers: %s), %d greedy tokens' % (a.model, a.prompt, hf_ids, a.tokens))
    for dt in a.dtypes.split(','):
        path = os.path.join(tmp, 'model-%s.gguf' % dt)
        # (general.name must not contain "phi3": llama.cpp's vocabulary loader then wants a "</s>" token)
        p = subprocess.run([a.zeroserve, 'convert', '--model', a.model, '--out', path, '--dtype', dt, '--name', 'zs-check'],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print('%-7s convert failed: %s' % (dt, p.stderr.strip()))
            failed = True
            continue
        errs = []
        n_eq, n_t, types = check_file(lib, path, a.model, cfg, st, errs)
        zs_ids, zs_logits = zeroserve_run(a.zeroserve, path, a.prompt, a.tokens, tmp)
        ll_ids, ll_logits, ll_forced, ll_prompt = llama_run(path, hf_ids, a.tokens, zs_ids)
        if ll_prompt != hf_ids:
            errs.append('llama.cpp tokenizes the prompt as %s, tokenizers as %s' % (ll_prompt, hf_ids))
        first = next((i for i, (x, y) in enumerate(zip(zs_ids, ll_ids)) if x != y), None)
        dforced = float(np.max(np.abs(zs_logits - ll_forced)))
        kb = next((i for i, (x, y) in enumerate(zip(zs_ids, base_ids)) if x != y), len(base_ids))
        dbase = float(np.max(np.abs(zs_logits[:kb] - base_logits[:kb]))) if kb else float('nan')
        if first is None:
            greedy = 'same %d/%d' % (len(ll_ids), len(ll_ids))
        else:  # where they part, how close llama.cpp's own top two were
            row = ll_logits[first]
            greedy = 'same for %d/%d, then %d vs %d (llama.cpp margin %.3g)' % (first, len(ll_ids), zs_ids[first],
                                                                                ll_ids[first], row[ll_ids[first]] - row[zs_ids[first]])
            if dt == 'f32':  # the same arithmetic: any difference is an error
                errs.append('greedy ids differ from position %d' % first)
        ddeq = ''
        if dt != 'f32':  # llama.cpp on the weights dequantized to F32: its arithmetic then matches ours
            dpath = os.path.join(tmp, 'model-%s-dequantized.gguf' % dt)
            dequantized_copy(path, dpath)
            _, _, dq_forced, _ = llama_run(dpath, hf_ids, 1, zs_ids)
            dd = float(np.max(np.abs(zs_logits - dq_forced)))
            ddeq = '; vs llama.cpp on the file dequantized to F32 %.3g' % dd
            if dd > tol:
                errs.append('zeroserve differs by %.3g from llama.cpp on the dequantized weights' % dd)
        conv = ''
        if a.converter_python and dt in ('f32', 'f16', 'bf16', 'q8_0'):
            theirs = os.path.join(tmp, 'model-%s-llamacpp.gguf' % dt)
            run_converter(a.converter_python, a.converter, a.model, theirs, dt, tmp)
            notes = []
            ne, nt = compare_with_converter(path, theirs, cfg, errs, notes)
            conv = "; vs convert_hf_to_gguf.py: %d/%d tensors byte-equal, %d deliberate differences" % (ne, nt, len(notes))
            for x in notes:
                print('        note: ' + x)
        print('%-7s tensors %d/%d byte-equal to numpy/ggml (%s); greedy ids zeroserve vs llama.cpp: %s; max |logit '
              'diff| vs llama.cpp over the %d positions (same context) %.3g%s; vs zeroserve on the HF dir (f32): ids '
              '%s, max |logit diff| %.3g' % (dt, n_eq, n_t, ', '.join('%s %d' % kv for kv in sorted(types.items())),
                                             greedy, len(zs_ids), dforced, ddeq,
                                             'same' if zs_ids == base_ids else 'same for %d' % kb, dbase) + conv)
        for e in errs:
            print('        FAIL: ' + e)
        failed |= bool(errs)
    if not a.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if failed else 0)


PROMPT = ''
if __name__ == '__main__':
    main()
