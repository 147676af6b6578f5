#!/usr/bin/env python3
"""peers.py — zeroserve and llama.cpp on the same GGUF files, interleaved (make bench-peers).

The model: a random 233M-parameter Llama (11 layers, dim 1024, GQA 16/4, ffn 4096, vocab 32000,
untied head; the issue's bench model) made by `zeroserve init-model`, converted to an F32 GGUF by
`zeroserve convert`, then quantized by llama.cpp's own quantizer (llama_model_quantize, the code
of llama-quantize) to F16, BF16, Q8_0, Q4_0 (pure: every matrix in the type) and Q4_K_M (its mix).
Both engines then run each file as stored. For every round, dtype and prompt length, one run of
each engine, alternating which goes first: `zeroserve bench --runs 1` (which also measures the
memory bandwidth in the same run) and llama.cpp through llama-cpp-python's low-level API (one
llama_decode of the prompt, then DECODE single-token decodes; both on a KV cache of the same type).
Prints per dtype and prompt: medians of prefill and decode tokens/s, the ratios zeroserve /
llama.cpp, and zeroserve's decode weight read against the bandwidth. Then ZeRO-3 offload to
NVMe shard files (one rank, the same live budget): decode at q4_0 against bf16.
"""
import argparse, json, os, random, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
Z = os.path.join(ROOT, "zeroserve")
FTYPES = {"f16": 1, "q4_0": 2, "q8_0": 7, "q4_k_m": 15, "bf16": 32}


def sh(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return r.stdout


def make_models(cache, dtypes):
    d = os.path.join(cache, "bench-m233")
    if not os.path.exists(os.path.join(d, "config.json")):
        print(f"writing the 233M model into {d}", file=sys.stderr)
        sh([Z, "init-model", "--arch", "llama", "--layers", "11", "--dim", "1024", "--heads", "16",
            "--kv-heads", "4", "--ffn", "4096", "--vocab", "32000", "--context", "2048", "--dtype", "f32",
            "--seed", "7", "--untied", "--out", d])
    files = {"f32": os.path.join(cache, "bench-m233-f32.gguf")}
    if not os.path.exists(files["f32"]):
        sh([Z, "convert", "--model", d, "--out", files["f32"], "--dtype", "f32"])
    import ctypes, llama_cpp
    for dt in dtypes:
        if dt == "f32":
            continue
        f = os.path.join(cache, f"bench-m233-{dt}.gguf")
        if not os.path.exists(f):
            p = llama_cpp.llama_model_quantize_default_params()
            p.ftype = FTYPES[dt]
            p.pure = dt != "q4_k_m"
            p.nthread = os.cpu_count() or 2
            if llama_cpp.llama_model_quantize(files["f32"].encode(), (f + ".part").encode(), ctypes.byref(p)) != 0:
                raise SystemExit(f"llama_model_quantize -> {dt} failed")
            os.rename(f + ".part", f)
        files[dt] = f
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", required=True)
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", 3)))
    ap.add_argument("--dtypes", default=os.environ.get("DTYPES", "f32 f16 bf16 q8_0 q4_0 q4_k_m"))
    ap.add_argument("--prompts", default=os.environ.get("PROMPTS", "128 1024"))
    ap.add_argument("--decode", type=int, default=int(os.environ.get("DECODE", 32)))
    ap.add_argument("--kv", default=os.environ.get("KV", "f16"))
    ap.add_argument("--nvme", type=int, default=int(os.environ.get("NVME", 1)))
    ap.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", os.cpu_count() or 2)))
    a = ap.parse_args()
    dtypes, prompts = a.dtypes.split(), [int(p) for p in a.prompts.split()]
    kv_ggml = {"f32": 0, "f16": 1}[a.kv]
    os.makedirs(a.cache, exist_ok=True)
    files = make_models(a.cache, dtypes)
    res = {}
    for r in range(a.rounds):
        for dt in dtypes:
            for P in prompts:
                key = (dt, P)
                z_first = (r + dtypes.index(dt) + prompts.index(P)) % 2 == 0
                order = ("zs", "llama") if z_first else ("llama", "zs")
                for eng in order:
                    if eng == "zs":
                        x = run_zs(files[dt], P, a.decode, a.kv, a.threads)
                    else:
                        x = run_llama(files[dt], P, a.decode, kv_ggml, a.threads)
                    res.setdefault(key, {}).setdefault(eng, []).append(x)
                z, l = res[key]["zs"][-1], res[key]["llama"][-1]
                print(f"round {r + 1} {dt:7s} P={P:5d}: zeroserve {z['prefill_tok_s']:7.1f} / {z['decode_tok_s']:6.2f}"
                      f"   llama.cpp {l['prefill_tok_s']:7.1f} / {l['decode_tok_s']:6.2f}  (prefill / decode tok/s)",
                      file=sys.stderr, flush=True)
    print(f"\nzeroserve vs llama.cpp (llama-cpp-python 0.3.16) on the same GGUF files; {a.threads} threads, "
          f"KV cache {a.kv}, decode {a.decode} tokens after the prompt; medians of {a.rounds} interleaved rounds")
    print(f"{'dtype':7s} {'prompt':>6s} | {'prefill zs':>10s} {'llama.cpp':>9s} {'ratio':>5s} | {'decode zs':>9s} "
          f"{'llama.cpp':>9s} {'ratio':>5s} | {'read GB/s':>9s} {'mem GB/s':>8s} {'read/bw':>7s}")
    summary = []
    for dt in dtypes:
        for P in prompts:
            z, l = res[(dt, P)]["zs"], res[(dt, P)]["llama"]
            zp, lp = med([x["prefill_tok_s"] for x in z]), med([x["prefill_tok_s"] for x in l])
            zd, ld = med([x["decode_tok_s"] for x in z]), med([x["decode_tok_s"] for x in l])
            rd, bw = med([x["decode_weight_gbps"] for x in z]), med([x["mem_bw_gbps"] for x in z])
            rb = med([x["decode_bw_ratio"] for x in z])
            print(f"{dt:7s} {P:6d} | {zp:10.1f} {lp:9.1f} {zp / lp:5.2f} | {zd:9.2f} {ld:9.2f} {zd / ld:5.2f} | "
                  f"{rd:9.2f} {bw:8.2f} {rb:7.2f}")
            summary.append({"dtype": dt, "prompt": P, "zs_prefill": zp, "peer_prefill": lp, "zs_decode": zd,
                            "peer_decode": ld, "read_gbps": rd, "mem_gbps": bw, "read_bw_ratio": rb})
    if a.nvme:
        nv = os.path.join(a.cache, "bench-m233-shards")
        os.makedirs(nv, exist_ok=True)
        live = str(300_000_000)
        out = {}
        for r in range(a.rounds):
            for dt in ("bf16", "q4_0"):
                if dt not in files:
                    continue
                os.makedirs(os.path.join(nv, dt), exist_ok=True)
                x = run_zs(files[dt], 16, 8, a.kv, a.threads,
                           ("--offload", "nvme", "--nvme-path", os.path.join(nv, dt), "--max-live-bytes", live))
                out.setdefault(dt, []).append(x["decode_tok_s"])
        if "bf16" in out and "q4_0" in out:
            b, q = med(out["bf16"]), med(out["q4_0"])
            print(f"\nZeRO-3 NVMe offload (1 rank, live budget {int(live) // 1000000} MB, O_DIRECT io_uring): decode "
                  f"bf16 {b:.2f}, q4_0 {q:.2f} tok/s; q4_0 / bf16 = {q / b:.2f} (goal >= 3)")
            summary.append({"nvme_bf16_decode": b, "nvme_q4_0_decode": q, "ratio": q / b})
    if os.environ.get("JSON"):
        json.dump(summary, open(os.environ["JSON"], "w"), indent=1)


if __name__ == "__main__":
    main()
