#!/bin/sh
# e2e-deploy-lint.sh — static checks of deploy/ (fast, no network, no containers):
#   - deploy/k8s/*.yaml parse (python3-yaml) and hang together: kinds, labels/selectors, named
#     ports, probes on /health, nvidia.com/gpu limits, the API key from the Secret, PVC names
#   - deploy/compose.yaml: services, GPU reservation in the CUDA service, env file, volumes
#   - deploy/zeroserve.service: `systemd-analyze verify` (when present) plus key checks
#   - deploy/Dockerfile, deploy/Dockerfile.cuda: a small structural linter (no hadolint in
#     Debian): FROM lines, multi-stage, COPY --from stages, non-root USER, HEALTHCHECK on
#     /health, EXPOSE 8080, ENTRYPOINT, COPY sources that exist and are not .dockerignored
#   - deploy/entrypoint.sh: `sh -n` and a dry run with a stub zeroserve (env → flags)
# Exit 0 pass, 1 fail, 77 skip (no YAML parser and not root to install python3-yaml).
set -u
cd "$(dirname "$0")/.." || exit 1
PY=/usr/bin/python3
if ! [ -x $PY ] || ! $PY -c 'import yaml' 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing python3-yaml"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-yaml >/dev/null 2>&1 ||
            { apt-get update -qq >/dev/null 2>&1 &&
              DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-yaml >/dev/null 2>&1; }
    fi
    if ! [ -x $PY ] || ! $PY -c 'import yaml' 2>/dev/null; then
        echo "SKIP: no python3-yaml (apt-get install python3-yaml)"; exit 77
    fi
fi
fail=0

# --- systemd unit: systemd-analyze verify on a copy whose binary and env file exist here
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
if command -v systemd-analyze >/dev/null 2>&1; then
    sed 's#^ExecStart=/usr/local/bin/zeroserve#ExecStart=/bin/true#; s#^EnvironmentFile=.*#EnvironmentFile=-/nonexistent#' \
        deploy/zeroserve.service > "$tmp/zeroserve.service"
    out=$(systemd-analyze verify "$tmp/zeroserve.service" 2>&1)
    rc=$?
    # verify exits 0 on unknown keys and bad values but prints them: any line naming the file fails
    bad=$(printf '%s\n' "$out" | grep "zeroserve.service" || true)
    if [ $rc -ne 0 ] || [ -n "$bad" ]; then
        echo "FAIL: systemd-analyze verify deploy/zeroserve.service:"; printf '%s\n' "$out"; fail=1
    else
        echo "ok: systemd-analyze verify deploy/zeroserve.service"
    fi
else
    echo "note: no systemd-analyze; key checks only"
fi

# --- entrypoint: syntax and a dry run with a stub zeroserve that prints its arguments
if sh -n deploy/entrypoint.sh; then
    mkdir -p "$tmp/bin" "$tmp/models/m"
    printf '#!/bin/sh\nfor a; do printf "[%%s]" "$a"; done; echo\n' > "$tmp/bin/zeroserve"
    chmod +x "$tmp/bin/zeroserve"
    got=$(PATH="$tmp/bin:$PATH" ZS_MODELS_DIR="$tmp/models" ZS_MODEL=m ZS_DATA_DIR="$tmp/data" \
          ZS_RANKS=2 ZS_OFFLOAD=nvme ZS_NVME_PATH="$tmp/nv" ZS_SERVED_MODEL_NAME="a b" \
          ZS_EXTRA_ARGS="--max-seqs 4" ZS_API_KEY=k sh deploy/entrypoint.sh --threads 2 2>&1)
    want="[serve][--model][$tmp/models/m][--host][0.0.0.0][--port][8080][--data-dir][$tmp/data][--threads][2][--ranks][2][--offload][nvme][--nvme-path][$tmp/nv][--served-model-name][a b][--max-seqs][4]"
    if [ "$got" != "$want" ]; then
        echo "FAIL: entrypoint dry run"; echo "  got:  $got"; echo "  want: $want"; fail=1
    elif ! [ -d "$tmp/nv" ] || ! [ -d "$tmp/data" ]; then
        echo "FAIL: entrypoint did not create the data and NVMe directories"; fail=1
    elif (PATH="$tmp/bin:$PATH" ZS_MODELS_DIR="$tmp/models" ZS_MODEL=missing sh deploy/entrypoint.sh) >/dev/null 2>&1; then
        echo "FAIL: entrypoint accepted a missing model directory"; fail=1
    elif [ "$(PATH="$tmp/bin:$PATH" sh deploy/entrypoint.sh zeroserve generate --x)" != "[generate][--x]" ]; then
        echo "FAIL: entrypoint does not exec a given command"; fail=1
    else
        echo "ok: deploy/entrypoint.sh maps ZS_* to serve flags"
    fi
else
    echo "FAIL: sh -n deploy/entrypoint.sh"; fail=1
fi

$PY - <<'PYEOF' || fail=1
import glob, os, re, sys
import yaml

errors = []
def err(msg): errors.append(msg)
def load_all(path):
    try:
        with open(path) as f:
            return [d for d in yaml.safe_load_all(f) if d is not None]
    except Exception as e:
        err(f"{path}: YAML does not parse: {e}"); return []

# ---------------- Kubernetes
docs = {}
for path in sorted(glob.glob("deploy/k8s/*.yaml")):
    for d in load_all(path):
        if not isinstance(d, dict): err(f"{path}: a document is not a mapping"); continue
        if d.get("kind") == "Kustomization":
            for r in d.get("resources", []):
                if not os.path.exists(os.path.join("deploy/k8s", r)): err(f"{path}: resource {r} missing")
            continue
        for k in ("apiVersion", "kind", "metadata"):
            if k not in d: err(f"{path}: document without {k}")
        name = (d.get("metadata") or {}).get("name")
        if not name: err(f"{path}: {d.get('kind')} without metadata.name")
        docs.setdefault(d.get("kind"), []).append((path, d))

def one(kind):
    l = docs.get(kind, [])
    if not l: err(f"k8s: no {kind}")
    return l
secrets = {d["metadata"]["name"]: d for _, d in docs.get("Secret", [])}
pvcs = {d["metadata"]["name"] for _, d in docs.get("PersistentVolumeClaim", [])}
services = [(p, d) for p, d in docs.get("Service", [])]
one("Secret"); one("PersistentVolumeClaim"); one("Service"); one("Deployment"); one("StatefulSet")

def check_workload(path, d, need_gpu, shared_pvcs_ok):
    kind, name = d["kind"], d["metadata"]["name"]
    where = f"{path}: {kind} {name}"
    spec = d.get("spec", {}); tpl = spec.get("template", {}); pod = tpl.get("spec", {})
    sel = (spec.get("selector") or {}).get("matchLabels") or {}
    labels = (tpl.get("metadata") or {}).get("labels") or {}
    if not sel or any(labels.get(k) != v for k, v in sel.items()):
        err(f"{where}: selector.matchLabels {sel} not in the template labels {labels}")
    sc = pod.get("securityContext") or {}
    if not sc.get("runAsNonRoot") or not sc.get("runAsUser"):
        err(f"{where}: pod securityContext must set runAsNonRoot and a non-zero runAsUser")
    if (pod.get("terminationGracePeriodSeconds") or 30) <= 10:
        err(f"{where}: terminationGracePeriodSeconds must exceed the 10 s drain")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    for t in spec.get("volumeClaimTemplates", []) or []:
        vols[t["metadata"]["name"]] = t
    for v in vols.values():
        claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
        if claim and claim not in pvcs and not shared_pvcs_ok:
            err(f"{where}: volume {v['name']} uses PVC {claim}, which no manifest defines")
    cs = pod.get("containers") or []
    if len(cs) != 1: err(f"{where}: expected one container"); return labels, {}
    c = cs[0]
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    if 8080 not in ports.values(): err(f"{where}: no containerPort 8080")
    for probe in ("readinessProbe", "livenessProbe"):
        pr = c.get(probe) or {}
        hg = pr.get("httpGet") or {}
        if hg.get("path") != "/health": err(f"{where}: {probe} is not an httpGet on /health")
        if isinstance(hg.get("port"), str) and hg.get("port") not in ports:
            err(f"{where}: {probe} port {hg.get('port')} is not a named container port")
    env = {e["name"]: e for e in c.get("env", [])}
    if "ZS_MODEL" not in env: err(f"{where}: no ZS_MODEL")
    ref = ((env.get("ZS_API_KEY") or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
    if not ref: err(f"{where}: ZS_API_KEY does not come from a Secret")
    elif ref.get("name") not in secrets:
        err(f"{where}: ZS_API_KEY from Secret {ref.get('name')}, which no manifest defines")
    else:
        s = secrets[ref["name"]]
        if ref.get("key") not in (s.get("stringData") or {}) and ref.get("key") not in (s.get("data") or {}):
            err(f"{where}: Secret {ref['name']} has no key {ref.get('key')}")
    res = c.get("resources") or {}
    if need_gpu and "nvidia.com/gpu" not in (res.get("limits") or {}):
        err(f"{where}: no nvidia.com/gpu limit")
    if "memory" not in (res.get("limits") or {}): err(f"{where}: no memory limit")
    csc = c.get("securityContext") or {}
    if csc.get("allowPrivilegeEscalation") is not False:
        err(f"{where}: allowPrivilegeEscalation must be false")
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    for m in mounts.values():
        if m["name"] not in vols: err(f"{where}: volumeMount {m['name']} has no volume")
    for p in ("/models", "/data"):
        if p not in mounts: err(f"{where}: nothing mounted at {p}")
    if "/models" in mounts and not mounts["/models"].get("readOnly"):
        err(f"{where}: /models should be mounted readOnly")
    if csc.get("readOnlyRootFilesystem") and "/tmp" not in mounts:
        err(f"{where}: readOnlyRootFilesystem without a /tmp volume")
    return labels, ports

for path, d in docs.get("Deployment", []):
    labels, ports = check_workload(path, d, True, False)
    if (d["spec"].get("replicas") or 1) != 1: err(f"{path}: the single-node Deployment should have 1 replica")
    if (d["spec"].get("strategy") or {}).get("type") != "Recreate":
        err(f"{path}: use strategy Recreate (RWO volume, GPUs)")
    svc = [s for _, s in services if s["spec"].get("selector") and
           all(labels.get(k) == v for k, v in s["spec"]["selector"].items()) and s["spec"].get("clusterIP") != "None"]
    if not svc: err(f"{path}: no Service selects the Deployment's pods")
    for s in svc:
        for p in s["spec"].get("ports", []):
            tp = p.get("targetPort")
            if isinstance(tp, str) and tp not in ports: err(f"Service {s['metadata']['name']}: targetPort {tp} unknown")
            if isinstance(tp, int) and tp not in ports.values(): err(f"Service {s['metadata']['name']}: targetPort {tp} unknown")
for path, d in docs.get("StatefulSet", []):
    check_workload(path, d, True, True)
    text = open(path).read().lower()
    if "mpirun" not in text: err(f"{path}: must say how the processes are started as one world (mpirun)")
    hs = [s for _, s in services if s["metadata"]["name"] == d["spec"].get("serviceName")]
    if not hs or hs[0]["spec"].get("clusterIP") != "None":
        err(f"{path}: serviceName {d['spec'].get('serviceName')} is not a headless Service")
    aff = (((d["spec"]["template"]["spec"].get("affinity") or {}).get("podAntiAffinity")) or {})
    if not aff: err(f"{path}: no podAntiAffinity (one pod per node)")
if not errors: print(f"ok: deploy/k8s ({sum(len(v) for v in docs.values())} objects)")

# ---------------- compose
n_before = len(errors)
c = (load_all("deploy/compose.yaml") or [{}])[0]
svcs = c.get("services") or {}
if "zeroserve" not in svcs: err("compose: no service zeroserve")
gpu = [n for n, s in svcs.items() if any(dev.get("driver") == "nvidia" and "gpu" in (dev.get("capabilities") or [])
        for dev in ((((s.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []))]
if not gpu: err("compose: no service reserves an nvidia GPU")
for n in gpu:
    if not svcs[n].get("profiles"): err(f"compose: GPU service {n} should be behind a profile")
named = set((c.get("volumes") or {}).keys())
for n, s in svcs.items():
    b = s.get("build") or {}
    df = os.path.normpath(os.path.join("deploy", b.get("context", "."), b.get("dockerfile", "Dockerfile")))
    if not os.path.exists(df): err(f"compose: {n}: dockerfile {df} missing")
    ef = s.get("env_file")
    ef = [ef] if isinstance(ef, str) else [e if isinstance(e, str) else e.get("path") for e in (ef or [])]
    if not ef: err(f"compose: {n}: no env_file (the API key)")
    for e in ef:
        if not os.path.exists(os.path.join("deploy", e + ".example")): err(f"compose: {n}: no deploy/{e}.example")
    targets = {}
    for v in s.get("volumes", []):
        parts = re.sub(r"\$\{[^}]*\}", "$VAR", v).split(":")
        src, dst = parts[0], parts[1]
        targets[dst] = src
        if not src.startswith(("/", ".", "$")) and src not in named: err(f"compose: {n}: volume {src} not declared")
    for p in ("/models", "/data", "/nvme"):
        if p not in targets: err(f"compose: {n}: nothing mounted at {p}")
    if (s.get("environment") or {}).get("ZS_NVME_PATH") != "/nvme": err(f"compose: {n}: ZS_NVME_PATH is not /nvme")
    hc = " ".join((s.get("healthcheck") or {}).get("test") or [])
    if "/health" not in hc: err(f"compose: {n}: no healthcheck on /health")
    if not any(str(p).endswith(":8080") for p in s.get("ports", [])): err(f"compose: {n}: port 8080 not published")
if not os.path.exists("deploy/zeroserve.env.example") or "ZS_API_KEY=" not in open("deploy/zeroserve.env.example").read():
    err("deploy/zeroserve.env.example: no ZS_API_KEY")
if len(errors) == n_before: print(f"ok: deploy/compose.yaml ({len(svcs)} services, GPU: {', '.join(gpu)})")

# ---------------- systemd unit: key checks
n_before = len(errors)
unit = {}
sec = None
text = re.sub(r"\\\n", " ", open("deploy/zeroserve.service").read())
for line in text.splitlines():
    line = line.strip()
    if not line or line[0] in "#;": continue
    if line.startswith("["): sec = line.strip("[]"); continue
    k, _, v = line.partition("=")
    unit.setdefault((sec, k), []).append(v)
def want(sec, k, pred, what):
    vs = unit.get((sec, k))
    if not vs or not pred(vs[-1]): err(f"zeroserve.service: [{sec}] {k} should be {what}")
want("Service", "ExecStart", lambda v: " serve " in v and "--data-dir" in v, "zeroserve serve ... --data-dir")
want("Service", "ProtectSystem", lambda v: v == "strict", "strict")
want("Service", "ProtectHome", lambda v: v in ("yes", "true", "read-only", "tmpfs"), "yes")
want("Service", "PrivateTmp", lambda v: v in ("yes", "true"), "yes")
want("Service", "NoNewPrivileges", lambda v: v in ("yes", "true"), "yes")
want("Service", "StateDirectory", lambda v: v.strip() != "", "set")
want("Service", "ReadWritePaths", lambda v: v.strip() != "", "set (the NVMe path)")
want("Service", "Restart", lambda v: v == "on-failure", "on-failure")
want("Service", "KillSignal", lambda v: v == "SIGTERM", "SIGTERM")
want("Service", "TimeoutStopSec", lambda v: v.rstrip("s").isdigit() and int(v.rstrip("s")) > 10, "> 10 s (the drain)")
want("Service", "EnvironmentFile", lambda v: v.strip() != "", "set (the API key)")
want("Install", "WantedBy", lambda v: v.strip() != "", "set")
if not (unit.get(("Service", "DynamicUser")) == ["yes"] or unit.get(("Service", "User"))):
    err("zeroserve.service: needs DynamicUser=yes or User=")
if "--api-key" in " ".join(unit.get(("Service", "ExecStart"), [])):
    err("zeroserve.service: the API key must come from the environment, not the command line")
if len(errors) == n_before: print("ok: deploy/zeroserve.service keys")

# ---------------- Dockerfiles: a small structural linter
ignore = [l.strip() for l in open(".dockerignore") if l.strip() and not l.startswith("#")]
for p in (".git", "build/", "models/", "zeroserve-data/"):
    if p not in ignore and p.rstrip("/") not in ignore: err(f".dockerignore: {p} missing")
def ignored(path):
    import fnmatch
    for pat in ignore:
        pat = pat.rstrip("/")
        if pat.startswith("**/"):
            if fnmatch.fnmatch(os.path.basename(path), pat[3:]): return True
        elif path == pat or path.startswith(pat + "/") or fnmatch.fnmatch(path, pat): return True
    return False
KNOWN = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
         "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL", "MAINTAINER"}
for df, base in (("deploy/Dockerfile", "debian:bookworm-slim"), ("deploy/Dockerfile.cuda", "nvidia/cuda:")):
    n_before = len(errors)
    text = re.sub(r"\\\n", " ", open(df).read())
    ins = []
    for no, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"): continue
        word = s.split()[0].upper()
        if word not in KNOWN: err(f"{df}: unknown instruction {word!r}: {s[:60]}"); continue
        ins.append((word, s[len(word):].strip()))
    if not ins or ins[0][0] not in ("FROM", "ARG"): err(f"{df}: must start with FROM (or ARG)")
    args = {a.split("=")[0]: (a.split("=", 1)[1] if "=" in a else "") for w, a in ins if w == "ARG"}
    stages, cur = [], None
    for w, a in ins:
        if w == "FROM":
            parts = a.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), "?"), parts[0])
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            cur = {"image": image, "name": name, "ins": []}; stages.append(cur)
        elif cur is not None:
            cur["ins"].append((w, a))
    if len(stages) < 2: err(f"{df}: not multi-stage ({len(stages)} FROM)")
    if not all(st["image"].startswith(base) for st in stages): err(f"{df}: FROM images {[st['image'] for st in stages]} are not {base}*")
    if base.startswith("nvidia"):
        if not re.search(r"-devel-", stages[0]["image"]) or not re.search(r"-runtime-", stages[-1]["image"]):
            err(f"{df}: build from a -devel image and run on a -runtime one")
    names = [st["name"] for st in stages]
    build_runs = " ".join(a for w, a in stages[0]["ins"] if w == "RUN")
    if "make" not in build_runs or "zeroserve" not in build_runs: err(f"{df}: the build stage does not run make ... zeroserve")
    want_cuda = "CUDA=1" if base.startswith("nvidia") else "CUDA=0"
    if want_cuda not in build_runs: err(f"{df}: the build stage should build with {want_cuda}")
    final = stages[-1]["ins"]
    kinds = [w for w, _ in final]
    for w, a in final:
        if w in ("COPY", "ADD"):
            toks = [t for t in a.split() if not t.startswith("--")]
            frm = [t.split("=", 1)[1] for t in a.split() if t.startswith("--from=")]
            if frm:
                if frm[0] not in names[:-1]: err(f"{df}: COPY --from={frm[0]} names no earlier stage")
            else:
                for src in toks[:-1]:
                    src = src.rstrip("/")
                    if not os.path.exists(src): err(f"{df}: COPY source {src} does not exist")
                    elif ignored(src): err(f"{df}: COPY source {src} is excluded by .dockerignore")
    users = [a for w, a in final if w == "USER"]
    if not users: err(f"{df}: the runtime stage has no USER")
    elif users[-1].split(":")[0] in ("root", "0"): err(f"{df}: USER is root")
    hc = [a for w, a in final if w == "HEALTHCHECK"]
    if not hc or "/health" not in hc[-1] or "curl" not in hc[-1]: err(f"{df}: no HEALTHCHECK curl .../health")
    if not any(w == "EXPOSE" and "8080" in a.split() for w, a in final): err(f"{df}: no EXPOSE 8080")
    vols = " ".join(a for w, a in final if w == "VOLUME")
    for v in ("/models", "/data"):
        if v not in vols: err(f"{df}: no VOLUME {v}")
    ep = [a for w, a in final if w == "ENTRYPOINT"]
    if not ep or not ep[-1].startswith("["): err(f"{df}: ENTRYPOINT must be in exec (JSON) form so signals reach zeroserve")
    runtime_runs = " ".join(a for w, a in final if w == "RUN")
    for lib in ("libjansson4", "libmicrohttpd12", "liburing2", "libopenmpi3", "curl"):
        if lib not in runtime_runs: err(f"{df}: the runtime stage does not install {lib}")
    if re.search(r"-dev\b", runtime_runs): err(f"{df}: the runtime stage installs -dev packages")
    if len(errors) == n_before: print(f"ok: {df} ({len(stages)} stages: {', '.join(st['image'] for st in stages)})")

for e in errors: print("FAIL:", e)
sys.exit(1 if errors else 0)
PYEOF

[ $fail = 0 ] && echo "deploy lint: all checks passed"
exit $fail
