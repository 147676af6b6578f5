// emu-runtime.cc — the CUDA runtime calls zeroserve makes, on the emulated device (tests only):
// devices with the H200's limits (ZS_EMU_DEVICES of them, default 2; ZS_EMU_MEM_MIB each, default
// 4096), device memory as separate host allocations (so AddressSanitizer sees a kernel read past
// an end) filled with 0xff (uninitialised floats read as NaN), pinned and registered host
// memory, copies and memsets on streams (emu-stream.cc), kernel launches with CUDA's launch
// checks, events, and the per-thread last error. Pageable host memory behaves as CUDA's does: an
// async copy from it is staged at once, one into it waits for the copy to finish. A pinned
// destination of an async copy from the device is poisoned when the copy is queued, so a host
// read before the stream is synchronised reads NaN. Freeing memory that queued work still uses,
// and launching a kernel with a pointer the device cannot reach, are faults (emu-internal.h).
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cuda-emu.h"
#include "emu-internal.h"
#include "emu-runtime.h"

namespace {

const int MAX_THREADS = 1024;
const unsigned MAX_GRID_YZ = 65535;
const size_t SMEM_DEFAULT = 48 * 1024, SMEM_OPTIN = 232448; // the H200's 227 KiB

struct Mem {
    char *p;
    size_t n;
    int kind; // ZS_EMU_MEM_*
    int dev;  // -1: host
};

struct State {
    std::mutex mu;
    std::map<uintptr_t, Mem> mem; // by start
    std::vector<size_t> used;      // device bytes per device
    std::map<std::pair<int, const void *>, int> smem_attr;
    std::set<std::string> warned;
    std::map<std::string, unsigned long> launches; // by kernel
};

State &st() {
    static State *s = new State();
    return *s;
}

thread_local int cur_dev = 0;
thread_local cudaError_t last_err = cudaSuccess;

cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess) last_err = e;
    return e;
}

int env_int(const char *name, int def) {
    const char *e = getenv(name);
    return e && *e ? atoi(e) : def;
}

size_t dev_bytes() { return (size_t)env_int("ZS_EMU_MEM_MIB", 4096) << 20; }

// the entry holding p (p may be the end of an allocation when `end_ok`)
const Mem *find_locked(const void *p, bool end_ok) {
    State &s = st();
    auto it = s.mem.upper_bound((uintptr_t)p);
    if (it == s.mem.begin()) return nullptr;
    --it;
    const Mem &m = it->second;
    const char *c = (const char *)p;
    if (c < m.p + m.n || (end_ok && c == m.p + m.n)) return &m;
    return nullptr;
}

void insert(char *p, size_t n, int kind, int dev) {
    std::lock_guard<std::mutex> g(st().mu);
    st().mem[(uintptr_t)p] = Mem{p, n, kind, dev};
    if (kind == ZS_EMU_MEM_DEVICE) st().used[dev] += n;
}

const char *kind_name(int k) {
    return k == ZS_EMU_MEM_DEVICE ? "device memory" : k == ZS_EMU_MEM_PINNED ? "pinned host memory"
                                                     : k == ZS_EMU_MEM_REGISTERED ? "registered host memory"
                                                                                    : "pageable host memory";
}

} // namespace

// ---- faults and warnings ----

void zs_emu_fault(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "zs-emu: FAULT: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    abort();
}

void zs_emu_warn(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    std::lock_guard<std::mutex> g(st().mu);
    if (st().warned.insert(buf).second) fprintf(stderr, "zs-emu: %s\n", buf);
}

// ---- memory table ----

int zs_emu_device_count(void) {
    static int n = [] {
        int v = env_int("ZS_EMU_DEVICES", 2);
        v = v < 1 ? 1 : v > 8 ? 8 : v;
        st().used.assign((size_t)v, 0);
        return v;
    }();
    return n;
}

int zs_emu_current_device(void) { return cur_dev; }
void zs_emu_set_device_of_thread(int dev) { cur_dev = dev; }

int zs_emu_mem_find(const void *p, zs_emu_range *r, int *dev) {
    std::lock_guard<std::mutex> g(st().mu);
    const Mem *m = find_locked(p, false);
    if (!m) return 0;
    if (r) *r = zs_emu_range{m->p, m->n};
    if (dev) *dev = m->dev;
    return m->kind;
}

void zs_emu_check_device_ptr(const void *p, size_t n, int dev, const char *what) {
    if (!p) return;
    std::lock_guard<std::mutex> g(st().mu);
    const Mem *m = find_locked(p, n == 0);
    if (!m)
        zs_emu_fault("%s: %p is not memory the device can reach (not from cudaMalloc, cudaMallocHost or "
                     "cudaHostRegister, or already freed)", what, p);
    if (m->kind == ZS_EMU_MEM_DEVICE && m->dev != dev)
        zs_emu_fault("%s: %p is device %d's memory, used by work on device %d (no peer access)", what, p, m->dev, dev);
    if ((const char *)p + n > m->p + m->n)
        zs_emu_fault("%s: %zu bytes at %p run %zu bytes past the end of their %s of %zu bytes", what, n, p,
                     (size_t)((const char *)p + n - (m->p + m->n)), kind_name(m->kind), m->n);
}

// ---- devices ----

extern "C" {

cudaError_t cudaGetDeviceCount(int *n) {
    if (!n) return fail(cudaErrorInvalidValue);
    *n = zs_emu_device_count();
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= zs_emu_device_count()) return fail(cudaErrorInvalidDevice);
    cur_dev = d;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) {
    if (!d) return fail(cudaErrorInvalidValue);
    *d = cur_dev;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    if (!p) return fail(cudaErrorInvalidValue);
    if (d < 0 || d >= zs_emu_device_count()) return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "zeroserve emulated device %d (H200 limits)", d);
    p->totalGlobalMem = dev_bytes();
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->sharedMemPerMultiprocessor = 233472;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = MAX_THREADS;
    p->maxThreadsPerMultiProcessor = 2048;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = (int)MAX_GRID_YZ;
    p->maxGridSize[2] = (int)MAX_GRID_YZ;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->l2CacheSize = 60 << 20;
    p->unifiedAddressing = 1;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->asyncEngineCount = 2;
    p->memoryBusWidth = 6144;
    p->totalConstMem = 65536;
    p->pciDeviceID = d;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
    if (!v) return fail(cudaErrorInvalidValue);
    if (d < 0 || d >= zs_emu_device_count()) return fail(cudaErrorInvalidDevice);
    switch (a) {
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)SMEM_OPTIN; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)SMEM_DEFAULT; break;
    case cudaDevAttrMaxThreadsPerBlock: *v = MAX_THREADS; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrMaxGridDimX: *v = 0x7fffffff; break;
    case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ: *v = (int)MAX_GRID_YZ; break;
    default:
        zs_emu_warn("cudaDeviceGetAttribute: attribute %d is not emulated", (int)a);
        return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot) {
    zs_emu_device_count();
    std::lock_guard<std::mutex> g(st().mu);
    size_t t = dev_bytes(), u = st().used[cur_dev];
    if (fr) *fr = t - u;
    if (tot) *tot = t;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    zs_emu_drain_device(cur_dev);
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_err;
    last_err = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_err; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "unknown error";
    }
}

// ---- memory ----

cudaError_t cudaMalloc(void **p, size_t n) {
    if (!p) return fail(cudaErrorInvalidValue);
    zs_emu_device_count();
    *p = nullptr;
    if (n == 0) return cudaSuccess;
    {
        std::lock_guard<std::mutex> g(st().mu);
        if (st().used[cur_dev] + n > dev_bytes()) return fail(cudaErrorMemoryAllocation);
    }
    void *m = nullptr;
    if (posix_memalign(&m, 256, n) != 0) return fail(cudaErrorMemoryAllocation);
    memset(m, 0xff, n);
    insert((char *)m, n, ZS_EMU_MEM_DEVICE, cur_dev);
    *p = m;
    return cudaSuccess;
}

static cudaError_t free_kind(void *p, int kind, const char *what) {
    if (!p) return cudaSuccess;
    Mem m;
    {
        std::lock_guard<std::mutex> g(st().mu);
        auto it = st().mem.find((uintptr_t)p);
        if (it == st().mem.end() || it->second.kind != kind) {
            zs_emu_warn("%s(%p): not a pointer it returned", what, p);
            return fail(kind == ZS_EMU_MEM_REGISTERED ? cudaErrorHostMemoryNotRegistered : cudaErrorInvalidValue);
        }
        m = it->second;
    }
    zs_emu_check_unused(m.p, m.n, what);
    std::lock_guard<std::mutex> g(st().mu);
    st().mem.erase((uintptr_t)p);
    if (kind == ZS_EMU_MEM_DEVICE) st().used[m.dev] -= m.n;
    if (kind != ZS_EMU_MEM_REGISTERED) free(p);
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) { return free_kind(p, ZS_EMU_MEM_DEVICE, "cudaFree"); }

cudaError_t cudaMallocHost(void **p, size_t n) {
    if (!p) return fail(cudaErrorInvalidValue);
    void *m = nullptr;
    if (posix_memalign(&m, 4096, n ? n : 1) != 0) return fail(cudaErrorMemoryAllocation);
    memset(m, 0xff, n);
    insert((char *)m, n ? n : 1, ZS_EMU_MEM_PINNED, -1);
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) { return free_kind(p, ZS_EMU_MEM_PINNED, "cudaFreeHost"); }

cudaError_t cudaHostRegister(void *p, size_t n, unsigned flags) {
    (void)flags;
    if (!p || !n) return fail(cudaErrorInvalidValue);
    {
        std::lock_guard<std::mutex> g(st().mu);
        const Mem *a = find_locked(p, false), *b = find_locked((char *)p + n - 1, false);
        if (a || b) return fail(cudaErrorHostMemoryAlreadyRegistered);
        auto it = st().mem.lower_bound((uintptr_t)p);
        if (it != st().mem.end() && it->first < (uintptr_t)p + n) return fail(cudaErrorHostMemoryAlreadyRegistered);
    }
    insert((char *)p, n, ZS_EMU_MEM_REGISTERED, -1);
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *p) { return free_kind(p, ZS_EMU_MEM_REGISTERED, "cudaHostUnregister"); }

// ---- copies and memsets ----

static cudaError_t copy_async(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s,
                              bool sync) {
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return fail(cudaErrorInvalidValue);
    int dev = zs_emu_stream_device(s);
    zs_emu_range dr{}, sr{};
    int ddev = -1, sdev = -1;
    int dk = zs_emu_mem_find(dst, &dr, &ddev), sk = zs_emu_mem_find(src, &sr, &sdev);
    bool dd = dk == ZS_EMU_MEM_DEVICE, sd = sk == ZS_EMU_MEM_DEVICE;
    bool ok = kind == cudaMemcpyDefault || (kind == cudaMemcpyHostToDevice && dd && !sd) ||
              (kind == cudaMemcpyDeviceToHost && sd && !dd) || (kind == cudaMemcpyDeviceToDevice && dd && sd) ||
              (kind == cudaMemcpyHostToHost && !dd && !sd);
    if (!ok) {
        zs_emu_warn("cudaMemcpy%s: kind %d does not match the pointers (destination %s, source %s)", sync ? "" : "Async",
                    (int)kind, kind_name(dk), kind_name(sk));
        return fail(cudaErrorInvalidValue);
    }
    if (dk) zs_emu_check_device_ptr(dst, n, dd ? ddev : dev, "cudaMemcpy destination");
    if (sk) zs_emu_check_device_ptr(src, n, sd ? sdev : dev, "cudaMemcpy source");
    zs_emu_op op;
    char what[96];
    snprintf(what, sizeof what, "cudaMemcpyAsync of %zu bytes %p -> %p", n, src, dst);
    op.what = what;
    op.ranges = {zs_emu_range{(const char *)dst, n}, zs_emu_range{(const char *)src, n}};
    if (!sk && !sync) {
        // pageable source: staged now, as CUDA does, so the caller may reuse it at once
        auto stage = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
        op.run = [dst, stage, n]() { memcpy(dst, stage->data(), n); };
        op.ranges.pop_back();
    } else {
        op.run = [dst, src, n]() { memmove(dst, src, n); };
    }
    if (!sync && dk && dk != ZS_EMU_MEM_DEVICE && !zs_emu_range_pending(dst, n))
        memset(dst, 0xff, n); // pinned destination: NaN until the copy has run
    cudaError_t e = zs_emu_enqueue(s, std::move(op));
    if (e != cudaSuccess) return fail(e);
    if (sync || !dk) return zs_emu_stream_sync(s); // pageable destination: CUDA returns when it is written
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
    return copy_async(dst, src, n, kind, s, false);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    return copy_async(dst, src, n, kind, nullptr, true);
}

static cudaError_t set_async(void *p, int v, size_t n, cudaStream_t s, bool sync) {
    if (n == 0) return cudaSuccess;
    int dev = zs_emu_stream_device(s), k = zs_emu_mem_find(p, nullptr, nullptr);
    if (k != ZS_EMU_MEM_DEVICE) {
        zs_emu_warn("cudaMemset%s(%p): %s, not device memory", sync ? "" : "Async", p, kind_name(k));
        return fail(cudaErrorInvalidValue);
    }
    zs_emu_check_device_ptr(p, n, dev, "cudaMemset");
    zs_emu_op op;
    op.what = "cudaMemsetAsync";
    op.ranges = {zs_emu_range{(const char *)p, n}};
    op.run = [p, v, n]() { memset(p, v, n); };
    cudaError_t e = zs_emu_enqueue(s, std::move(op));
    if (e != cudaSuccess) return fail(e);
    return sync ? zs_emu_stream_sync(s) : cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) { return set_async(p, v, n, s, false); }
cudaError_t cudaMemset(void *p, int v, size_t n) { return set_async(p, v, n, nullptr, true); }

// ---- streams and events ----

cudaError_t cudaStreamCreate(cudaStream_t *s) { return fail(zs_emu_stream_create(s, cudaStreamDefault)); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) { return fail(zs_emu_stream_create(s, f)); }
cudaError_t cudaStreamDestroy(cudaStream_t s) { return fail(zs_emu_stream_destroy(s)); }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return fail(zs_emu_stream_sync(s)); }
cudaError_t cudaStreamQuery(cudaStream_t s) {
    cudaError_t e = zs_emu_stream_query(s);
    return e == cudaErrorNotReady ? e : fail(e); // not ready is an answer, not an error to keep
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    if (!e) return fail(cudaErrorInvalidValue);
    zs_emu_event *ev = new zs_emu_event();
    ev->flags = flags;
    *e = (cudaEvent_t)ev;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    delete (zs_emu_event *)e; // a queued record keeps its own state alive
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    return fail(zs_emu_event_record((zs_emu_event *)e, s));
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    return fail(zs_emu_event_sync((zs_emu_event *)e));
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    cudaError_t r = zs_emu_event_query((zs_emu_event *)e);
    return r == cudaErrorNotReady ? r : fail(r);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    (void)flags;
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    return fail(zs_emu_stream_wait_event(s, (zs_emu_event *)e));
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!ms || !a || !b) return fail(cudaErrorInvalidValue);
    zs_emu_event *x = (zs_emu_event *)a, *y = (zs_emu_event *)b;
    if ((x->flags | y->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
    if (!zs_emu_event_done(x) || !zs_emu_event_done(y)) return fail(cudaErrorNotReady);
    std::shared_ptr<zs_emu_event_state> sa, sb;
    {
        std::lock_guard<std::mutex> g(x->mu);
        sa = x->state;
    }
    {
        std::lock_guard<std::mutex> g(y->mu);
        sb = y->state;
    }
    if (!sa || !sb) return fail(cudaErrorInvalidResourceHandle);
    *ms = (float)(sb->ms - sa->ms);
    return cudaSuccess;
}

// ---- kernels ----

cudaError_t cudaFuncSetAttribute(const void *fn, enum cudaFuncAttribute a, int v) {
    if (!fn) return fail(cudaErrorInvalidDeviceFunction);
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize) {
        zs_emu_warn("cudaFuncSetAttribute: attribute %d is not emulated", (int)a);
        return fail(cudaErrorInvalidValue);
    }
    if (v < 0 || (size_t)v > SMEM_OPTIN) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> g(st().mu);
    st().smem_attr[{cur_dev, fn}] = v;
    return cudaSuccess;
}

} // extern "C"

void zs_emu_launch_submit(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                          std::function<void()> body, std::vector<const void *> ptrs) {
    int dev = zs_emu_stream_device(s);
    if (dev != cur_dev) {
        zs_emu_warn("kernel %s: launched on a stream of device %d while device %d is current", name, dev, cur_dev);
        fail(cudaErrorInvalidResourceHandle);
        return;
    }
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (threads == 0 || threads > (unsigned)MAX_THREADS || block.x > 1024 || block.y > 1024 || block.z > 64) {
        zs_emu_warn("kernel %s: block (%u,%u,%u) is over the limit of %d threads (1024, 1024, 64)", name, block.x,
                    block.y, block.z, MAX_THREADS);
        fail(cudaErrorInvalidConfiguration);
        return;
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > MAX_GRID_YZ || grid.z > MAX_GRID_YZ) {
        zs_emu_warn("kernel %s: grid (%u,%u,%u) is outside the limits (2^31-1, 65535, 65535)", name, grid.x, grid.y,
                    grid.z);
        fail(cudaErrorInvalidConfiguration);
        return;
    }
    size_t limit = SMEM_DEFAULT;
    {
        std::lock_guard<std::mutex> g(st().mu);
        auto it = st().smem_attr.find({dev, fn});
        if (it != st().smem_attr.end() && (size_t)it->second > limit) limit = (size_t)it->second;
    }
    if (smem > limit) {
        zs_emu_warn("kernel %s: %zu bytes of dynamic shared memory, over the %zu bytes allowed (48 KiB, or what "
                    "cudaFuncSetAttribute opted in up to 227 KiB)", name, smem, limit);
        fail(cudaErrorInvalidValue);
        return;
    }
    zs_emu_op op;
    op.what = std::string("kernel ") + name;
    int i = 0;
    for (const void *p : ptrs) {
        i++;
        if (!p) continue;
        char what[160];
        snprintf(what, sizeof what, "kernel %s, pointer argument %d", name, i);
        zs_emu_check_device_ptr(p, 0, dev, what);
        zs_emu_range r{};
        zs_emu_mem_find(p, &r, nullptr);
        if (r.p) op.ranges.push_back(r);
    }
    {
        std::lock_guard<std::mutex> lk(st().mu);
        st().launches[name]++;
    }
    auto g = std::make_shared<zs_emu_grid>(zs_emu_grid{name, grid, block, smem, std::move(body)});
    op.run = [g]() { zs_emu_run_grid(*g); };
    cudaError_t e = zs_emu_enqueue(s, std::move(op));
    if (e != cudaSuccess) fail(e);
}

// cuBLAS and NCCL are looked for where $ZS_CUBLAS_LIB and $ZS_NCCL_LIB say: this library, which
// emulates both. ZS_EMU_DEVICE tells the tests they run emulated (smaller shapes). At exit, the
// launches of each kernel are appended to $ZS_EMU_LAUNCH_LOG ("program kernel count" lines, the
// kernel by its name without template arguments;
// tests/gpu/emu/coverage.sh checks that every kernel ran) and counted on stderr.
#include <dlfcn.h>
#include <errno.h>

__attribute__((destructor)) static void zs_emu_fini(void) {
    std::map<std::string, unsigned long> l;
    {
        std::lock_guard<std::mutex> g(st().mu);
        l = st().launches;
    }
    if (l.empty()) return;
    unsigned long n = 0;
    for (auto &k : l) n += k.second;
    fprintf(stderr, "zs-emu: %lu kernel launches (%zu kernels, template instances apart)\n", n, l.size());
    const char *path = getenv("ZS_EMU_LAUNCH_LOG");
    FILE *f = path && *path ? fopen(path, "a") : nullptr;
    if (!f) return;
    // the kernel's name as ZS_LAUNCH spelled it, without parentheses and template arguments
    std::map<std::string, unsigned long> base;
    for (auto &k : l) {
        std::string b;
        for (char ch : k.first) {
            if (ch == '<') break;
            if (ch != '(' && ch != ')' && ch != ' ') b += ch;
        }
        base[b] += k.second;
    }
    for (auto &k : base) fprintf(f, "%s %s %lu\n", program_invocation_short_name, k.first.c_str(), k.second);
    fclose(f);
}
__attribute__((constructor)) static void zs_emu_init(void) {
    Dl_info di;
    if (dladdr((void *)&zs_emu_init, &di) && di.dli_fname) {
        setenv("ZS_CUBLAS_LIB", di.dli_fname, 1);
        setenv("ZS_NCCL_LIB", di.dli_fname, 1);
    }
    setenv("ZS_EMU_DEVICE", "1", 1);
}
