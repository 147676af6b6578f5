// emu-nccl.cc — the NCCL calls zeroserve makes, on the emulated devices of one process (tests
// only). engine/comm/comm-nccl.c loads them with dlopen from $ZS_NCCL_LIB, which the emulator's
// library points at itself when it loads. A communicator is one rank of a group (ncclCommInitAll,
// or ncclCommInitRank with a unique id, inside a group call or from one thread per rank). A
// collective is queued on the caller's stream; when it runs there it meets the same collective
// (by its number on the communicator) of every other rank, and the last to arrive computes every
// rank's result: reductions in rank order, in f32 for 16-bit types (rounded once), so every rank
// receives the same bits. Ranks that disagree on a collective's kind, size or type are a fault.
// ncclCommAbort releases ranks waiting for a peer that will never come. Worlds spread over
// several processes are not emulated: ncclCommInitRank waits 60 s for the ranks of this process
// and then fails with ncclSystemError.
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "emu-internal.h"

namespace {

enum { C_ALLGATHER, C_REDUCESCATTER, C_ALLREDUCE, C_BROADCAST };
const char *coll_name(int k) {
    return k == C_ALLGATHER ? "ncclAllGather" : k == C_REDUCESCATTER ? "ncclReduceScatter"
                                              : k == C_ALLREDUCE ? "ncclAllReduce" : "ncclBroadcast";
}

struct Coll {
    int kind = -1, type = 0, op = 0, root = 0;
    size_t count = 0;
    std::vector<const void *> send;
    std::vector<void *> recv;
    int arrived = 0, left = 0;
    bool done = false;
};

struct Group {
    int n;
    std::mutex mu;
    std::condition_variable cv;
    std::atomic<bool> aborted{false};
    std::map<uint64_t, Coll> colls; // by collective number
    int joined = 0;                 // ncclCommInitRank: ranks that have joined
};

struct Comm {
    std::shared_ptr<Group> g;
    int rank, dev;
    uint64_t next = 0; // collectives issued
};

std::mutex reg_mu;
std::map<std::string, std::shared_ptr<Group>> *by_id; // unique id -> group being joined
thread_local int group_depth;
struct PendingInit {
    ncclComm_t *out;
    int n, rank, dev;
    std::string id;
};
thread_local std::vector<PendingInit> *pending;

size_t type_size(int t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

double ld(const void *p, int t, size_t i) {
    switch (t) {
    case ncclInt8: return ((const int8_t *)p)[i];
    case ncclUint8: return ((const uint8_t *)p)[i];
    case ncclInt32: return ((const int32_t *)p)[i];
    case ncclUint32: return ((const uint32_t *)p)[i];
    case ncclInt64: return (double)((const int64_t *)p)[i];
    case ncclUint64: return (double)((const uint64_t *)p)[i];
    case ncclFloat16: return __half2float(((const __half *)p)[i]);
    case ncclBfloat16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case ncclFloat32: return ((const float *)p)[i];
    default: return ((const double *)p)[i];
    }
}

void st(void *p, int t, size_t i, double v) {
    switch (t) {
    case ncclInt8: ((int8_t *)p)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case ncclFloat16: ((__half *)p)[i] = __float2half_rn((float)v); break;
    case ncclBfloat16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
    case ncclFloat32: ((float *)p)[i] = (float)v; break;
    default: ((double *)p)[i] = v; break;
    }
}

// element i reduced over the ranks' buffers at element offset off, in rank order; floats in f32
// (f64 in double), integers exactly
void reduce_into(const Coll &c, size_t off, size_t n, void *out) {
    bool f32 = c.type == ncclFloat16 || c.type == ncclBfloat16 || c.type == ncclFloat32;
    for (size_t i = 0; i < n; i++) {
        double acc = ld(c.send[0], c.type, off + i);
        float facc = (float)acc;
        for (size_t r = 1; r < c.send.size(); r++) {
            double v = ld(c.send[r], c.type, off + i);
            switch (c.op) {
            case ncclSum: acc += v; facc += (float)v; break;
            case ncclProd: acc *= v; facc *= (float)v; break;
            case ncclMax: acc = v > acc ? v : acc; facc = (float)acc; break;
            case ncclMin: acc = v < acc ? v : acc; facc = (float)acc; break;
            default: break;
            }
        }
        if (c.op == ncclAvg) {
            acc = 0;
            facc = 0;
            for (size_t r = 0; r < c.send.size(); r++) {
                acc += ld(c.send[r], c.type, off + i);
                facc += (float)ld(c.send[r], c.type, off + i);
            }
            acc /= (double)c.send.size();
            facc /= (float)c.send.size();
        }
        st(out, c.type, i, f32 ? (double)facc : acc);
    }
}

void compute(Coll &c) {
    size_t es = type_size(c.type), n = c.send.size();
    if (c.kind == C_ALLGATHER) {
        std::vector<char> all(c.count * es * n);
        for (size_t r = 0; r < n; r++) memcpy(all.data() + r * c.count * es, c.send[r], c.count * es);
        for (size_t r = 0; r < n; r++) memcpy(c.recv[r], all.data(), all.size());
    } else if (c.kind == C_BROADCAST) {
        std::vector<char> b((const char *)c.send[c.root], (const char *)c.send[c.root] + c.count * es);
        for (size_t r = 0; r < n; r++) memcpy(c.recv[r], b.data(), b.size());
    } else if (c.kind == C_ALLREDUCE) {
        std::vector<char> out(c.count * es);
        reduce_into(c, 0, c.count, out.data());
        for (size_t r = 0; r < n; r++) memcpy(c.recv[r], out.data(), out.size());
    } else {
        std::vector<std::vector<char>> outs(n, std::vector<char>(c.count * es));
        for (size_t r = 0; r < n; r++) reduce_into(c, r * c.count, c.count, outs[r].data());
        for (size_t r = 0; r < n; r++) memcpy(c.recv[r], outs[r].data(), outs[r].size());
    }
}

// runs on rank `rank`'s stream: meet the others at collective number `num`
void meet(const std::shared_ptr<Group> &g, uint64_t num, int rank, const Coll &mine) {
    std::unique_lock<std::mutex> lk(g->mu);
    if (g->aborted) return;
    Coll &c = g->colls[num];
    if (c.arrived == 0) {
        c.kind = mine.kind;
        c.type = mine.type;
        c.op = mine.op;
        c.root = mine.root;
        c.count = mine.count;
        c.send.assign((size_t)g->n, nullptr);
        c.recv.assign((size_t)g->n, nullptr);
    } else if (c.kind != mine.kind || c.type != mine.type || c.count != mine.count || c.op != mine.op ||
               c.root != mine.root) {
        zs_emu_fault("NCCL collective #%llu: rank %d calls %s of %zu elements (type %d, op %d, root %d), another rank "
                     "%s of %zu (type %d, op %d, root %d)",
                     (unsigned long long)num, rank, coll_name(mine.kind), mine.count, mine.type, mine.op, mine.root,
                     coll_name(c.kind), c.count, c.type, c.op, c.root);
    }
    c.send[rank] = mine.send[0];
    c.recv[rank] = mine.recv[0];
    if (++c.arrived == g->n) {
        compute(c);
        c.done = true;
        g->cv.notify_all();
    } else {
        g->cv.wait(lk, [&] { return c.done || g->aborted; });
    }
    if (++c.left == g->n) g->colls.erase(num);
}

ncclResult_t enqueue(ncclComm_t comm, int kind, const void *send, void *recv, size_t count, ncclDataType_t t,
                     int op, int root, cudaStream_t s) {
    Comm *c = (Comm *)comm;
    if (!c) return ncclInvalidArgument;
    size_t es = type_size(t);
    if (!es || (kind != C_ALLGATHER && kind != C_BROADCAST && (op < ncclSum || op > ncclAvg))) return ncclInvalidArgument;
    if (root < 0 || root >= c->g->n) return ncclInvalidArgument;
    if (zs_emu_stream_device(s) != c->dev) {
        zs_emu_warn("%s: a stream of device %d for the communicator of device %d", coll_name(kind),
                    zs_emu_stream_device(s), c->dev);
        return ncclInvalidUsage;
    }
    size_t n = (size_t)c->g->n, sb = count * es, rb = count * es;
    if (kind == C_ALLGATHER) rb *= n;
    if (kind == C_REDUCESCATTER) sb *= n;
    char what[64];
    snprintf(what, sizeof what, "%s send buffer", coll_name(kind));
    zs_emu_check_device_ptr(send, sb, c->dev, what);
    snprintf(what, sizeof what, "%s receive buffer", coll_name(kind));
    zs_emu_check_device_ptr(recv, rb, c->dev, what);
    Coll mine;
    mine.kind = kind;
    mine.type = t;
    mine.op = kind == C_ALLGATHER || kind == C_BROADCAST ? 0 : op;
    mine.root = kind == C_BROADCAST ? root : 0;
    mine.count = count;
    mine.send = {send};
    mine.recv = {recv};
    uint64_t num = c->next++;
    std::shared_ptr<Group> g = c->g;
    int rank = c->rank;
    zs_emu_op o;
    o.what = coll_name(kind);
    o.ranges = {zs_emu_range{(const char *)send, sb}, zs_emu_range{(const char *)recv, rb}};
    o.run = [g, num, rank, mine]() { meet(g, num, rank, mine); };
    // a collective must not wait for a host synchronisation of the other ranks' streams: queued
    // collectives run at once
    cudaError_t e = zs_emu_enqueue_now(s, std::move(o));
    return e == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

std::string id_key(const ncclUniqueId &id) { return std::string(id.internal, sizeof id.internal); }

// joins rank `rank` of the group behind id; waits until all n have joined (60 s at most)
ncclResult_t join(const std::string &key, int n, int rank, int dev, ncclComm_t *out) {
    std::shared_ptr<Group> g;
    {
        std::lock_guard<std::mutex> lk(reg_mu);
        if (!by_id) by_id = new std::map<std::string, std::shared_ptr<Group>>();
        auto &slot = (*by_id)[key];
        if (!slot) {
            slot = std::make_shared<Group>();
            slot->n = n;
        }
        g = slot;
    }
    if (g->n != n) return ncclInvalidArgument;
    std::unique_lock<std::mutex> lk(g->mu);
    g->joined++;
    g->cv.notify_all();
    bool all = g->cv.wait_for(lk, std::chrono::seconds(60), [&] { return g->joined >= g->n; });
    lk.unlock();
    if (!all) {
        zs_emu_warn("ncclCommInitRank: rank %d waited 60 s for %d ranks (the emulator joins the ranks of one process "
                    "only)", rank, n);
        return ncclSystemError;
    }
    {
        std::lock_guard<std::mutex> r(reg_mu);
        by_id->erase(key);
    }
    *out = (ncclComm_t) new Comm{g, rank, dev, 0};
    return ncclSuccess;
}

} // namespace

extern "C" {

ncclResult_t ncclGetVersion(int *v) {
    if (!v) return ncclInvalidArgument;
    *v = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (emulated)";
    case ncclSystemError: return "unhandled system error (emulated)";
    case ncclInternalError: return "internal error (emulated)";
    case ncclInvalidArgument: return "invalid argument (emulated)";
    case ncclInvalidUsage: return "invalid usage (emulated)";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return ncclInvalidArgument;
    static std::atomic<unsigned long long> counter{0};
    memset(id, 0, sizeof *id);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(id->internal, sizeof id->internal, "zs-emu %llu %lld.%09ld", ++counter, (long long)ts.tv_sec, ts.tv_nsec);
    return ncclSuccess;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int n, const int *devs) {
    if (!comms || n < 1) return ncclInvalidArgument;
    auto g = std::make_shared<Group>();
    g->n = n;
    for (int i = 0; i < n; i++) {
        int d = devs ? devs[i] : i;
        if (d < 0 || d >= zs_emu_device_count()) return ncclInvalidArgument;
        comms[i] = (ncclComm_t) new Comm{g, i, d, 0};
    }
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int n, ncclUniqueId id, int rank) {
    if (!out || n < 1 || rank < 0 || rank >= n) return ncclInvalidArgument;
    if (group_depth > 0) {
        if (!pending) pending = new std::vector<PendingInit>();
        pending->push_back(PendingInit{out, n, rank, zs_emu_current_device(), id_key(id)});
        return ncclSuccess;
    }
    return join(id_key(id), n, rank, zs_emu_current_device(), out);
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return ncclInvalidUsage;
    if (--group_depth > 0 || !pending || pending->empty()) return ncclSuccess;
    // the ranks this thread joins in one group call: each joins from a thread of its own, as
    // NCCL's group call lets one thread initialise several ranks
    std::vector<PendingInit> ps;
    ps.swap(*pending);
    std::vector<ncclResult_t> rs(ps.size(), ncclSuccess);
    std::vector<std::thread> ts;
    for (size_t i = 0; i < ps.size(); i++)
        ts.emplace_back([&, i] { rs[i] = join(ps[i].id, ps[i].n, ps[i].rank, ps[i].dev, ps[i].out); });
    for (auto &t : ts) t.join();
    for (ncclResult_t r : rs)
        if (r != ncclSuccess) return r;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    delete (Comm *)c;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!c) return ncclSuccess;
    Comm *x = (Comm *)c;
    {
        std::lock_guard<std::mutex> lk(x->g->mu);
        x->g->aborted = true;
        x->g->cv.notify_all();
    }
    delete x;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r) {
    if (!c || !r) return ncclInvalidArgument;
    *r = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t c,
                           cudaStream_t s) {
    return enqueue(c, C_ALLGATHER, send, recv, count, t, 0, 0, s);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t s) {
    return enqueue(c, C_REDUCESCATTER, send, recv, count, t, op, 0, s);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t s) {
    return enqueue(c, C_ALLREDUCE, send, recv, count, t, op, 0, s);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t s) {
    return enqueue(c, C_BROADCAST, send, recv, count, t, 0, root, s);
}

} // extern "C"
