// emu-stream.cc — streams and events of the emulated device, with CUDA's ordering: the work of a
// stream runs in order on that stream's own worker thread; cudaStreamWaitEvent orders one stream
// after another; the legacy default stream (NULL) waits for the device's blocking streams and
// they for it. Work runs lazily by default: a stream's worker starts an item only once something
// needs it done (a host synchronisation with the stream or one of its events, a query, or a
// queued wait on another stream that does), so the emulator takes the latest schedule CUDA
// allows. A host read before cudaStreamSynchronize then reads what was there before, and a
// kernel whose input copy was never waited for reads the poison of fresh memory, every time.
// ZS_EMU_SCHED=eager starts work as soon as it is queued instead.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "emu-internal.h"
#include "emu-runtime.h"

namespace {

struct Stream;

struct Item {
    uint64_t seq;
    zs_emu_op op;
    Stream *wait_s = nullptr; // a wait: for wait_s to have done wait_seq
    uint64_t wait_seq = 0;
    std::shared_ptr<zs_emu_event_state> stamp; // an event record: its time
};

struct Stream {
    int dev;
    bool legacy, blocking;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Item> q;
    uint64_t last = 0;     // the seq of the newest item queued
    uint64_t done = 0;     // every item up to this seq has run
    uint64_t released = 0; // the worker may run items up to this seq
    bool destroyed = false;
};

struct Registry {
    std::mutex mu;
    std::vector<Stream *> all;     // never freed: waits and events may name a destroyed stream
    std::vector<Stream *> legacy;  // per device, made on first use
};

Registry &reg() {
    static Registry *r = new Registry(); // no destructor at exit: workers may still run
    return *r;
}

bool eager() {
    static bool e = [] {
        const char *s = getenv("ZS_EMU_SCHED");
        return s && !strcmp(s, "eager");
    }();
    return e;
}

double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void release(Stream *s, uint64_t seq) {
    std::lock_guard<std::mutex> g(s->mu);
    if (seq > s->released) {
        s->released = seq;
        s->cv.notify_all();
    }
}

void wait_done(Stream *s, uint64_t seq) {
    release(s, seq);
    std::unique_lock<std::mutex> g(s->mu);
    s->cv.wait(g, [&] { return s->done >= seq; });
}

void worker(Stream *s) {
    std::unique_lock<std::mutex> g(s->mu);
    for (;;) {
        s->cv.wait(g, [&] { return (!s->q.empty() && s->q.front().seq <= s->released) || (s->destroyed && s->q.empty()); });
        if (s->q.empty()) return; // destroyed and drained
        const Item &it = s->q.front();
        g.unlock();
        zs_emu_set_device_of_thread(s->dev);
        if (it.wait_s) wait_done(it.wait_s, it.wait_seq);
        if (it.stamp) it.stamp->ms = now_ms();
        if (it.op.run) it.op.run();
        g.lock();
        s->done = it.seq;
        s->q.pop_front();
        s->cv.notify_all();
    }
}

Stream *new_stream(int dev, bool legacy, bool blocking) {
    Stream *s = new Stream();
    s->dev = dev;
    s->legacy = legacy;
    s->blocking = blocking;
    std::thread(worker, s).detach();
    reg().all.push_back(s);
    return s;
}

// the device's legacy stream (call with reg().mu held)
Stream *legacy_locked(int dev) {
    Registry &r = reg();
    if (r.legacy.size() <= (size_t)dev) r.legacy.resize((size_t)dev + 1, nullptr);
    if (!r.legacy[dev]) r.legacy[dev] = new_stream(dev, true, true);
    return r.legacy[dev];
}

Stream *resolve(cudaStream_t h) {
    if (h == nullptr || h == cudaStreamLegacy) {
        std::lock_guard<std::mutex> g(reg().mu);
        return legacy_locked(zs_emu_current_device());
    }
    return (Stream *)h;
}

bool known(Stream *s) {
    std::lock_guard<std::mutex> g(reg().mu);
    for (Stream *o : reg().all)
        if (o == s) return !s->destroyed;
    return false;
}

uint64_t push(Stream *s, Item it) {
    std::lock_guard<std::mutex> g(s->mu);
    it.seq = ++s->last;
    uint64_t seq = it.seq;
    s->q.push_back(std::move(it));
    if (eager()) s->released = seq;
    s->cv.notify_all();
    return seq;
}

uint64_t pending_of(Stream *s) {
    std::lock_guard<std::mutex> g(s->mu);
    return s->last > s->done ? s->last : 0;
}

// the implicit ordering of the legacy stream against the device's blocking streams
void order_legacy(Stream *s) {
    if (!s->blocking) return;
    std::vector<std::pair<Stream *, uint64_t>> waits;
    {
        std::lock_guard<std::mutex> g(reg().mu);
        if (s->legacy) {
            for (Stream *o : reg().all)
                if (o != s && o->dev == s->dev && o->blocking && !o->legacy && !o->destroyed) waits.push_back({o, 0});
        } else {
            waits.push_back({legacy_locked(s->dev), 0});
        }
    }
    for (auto &w : waits) {
        uint64_t p = pending_of(w.first);
        if (!p) continue;
        Item it;
        it.op.what = "implicit wait on the legacy stream";
        it.wait_s = w.first;
        it.wait_seq = p;
        push(s, std::move(it));
    }
}

bool overlaps(const zs_emu_op &op, const char *p, size_t n) {
    for (const zs_emu_range &r : op.ranges)
        if (r.p < p + (n ? n : 1) && p < r.p + (r.n ? r.n : 1)) return true;
    return false;
}

// the first queued item that has not finished and uses [p, p + n), described; "" when none
std::string pending_user(const void *p, size_t n) {
    std::lock_guard<std::mutex> g(reg().mu);
    for (Stream *s : reg().all) {
        std::lock_guard<std::mutex> h(s->mu);
        for (const Item &it : s->q)
            if (overlaps(it.op, (const char *)p, n)) {
                char buf[96];
                snprintf(buf, sizeof buf, " (device %d, %s stream %p)", s->dev, s->legacy ? "legacy" : "a",
                         (void *)s);
                return it.op.what + buf;
            }
    }
    return "";
}

} // namespace

static cudaError_t enqueue(cudaStream_t h, zs_emu_op op, bool now) {
    Stream *s = resolve(h);
    if (h && h != cudaStreamLegacy && !known(s)) return cudaErrorInvalidResourceHandle;
    order_legacy(s);
    Item it;
    it.op = std::move(op);
    uint64_t seq = push(s, std::move(it));
    if (now) release(s, seq);
    return cudaSuccess;
}

cudaError_t zs_emu_enqueue(cudaStream_t h, zs_emu_op op) { return enqueue(h, std::move(op), false); }
cudaError_t zs_emu_enqueue_now(cudaStream_t h, zs_emu_op op) { return enqueue(h, std::move(op), true); }

int zs_emu_stream_device(cudaStream_t h) {
    if (h == nullptr || h == cudaStreamLegacy) return zs_emu_current_device();
    return ((Stream *)h)->dev;
}

void zs_emu_check_unused(const void *p, size_t n, const char *what) {
    std::string u = pending_user(p, n);
    if (!u.empty()) zs_emu_fault("%s: the memory at %p (%zu bytes) is freed while queued work still uses it: %s", what, p, n, u.c_str());
}

int zs_emu_range_pending(const void *p, size_t n) { return !pending_user(p, n).empty(); }

void zs_emu_drain_device(int dev) {
    std::vector<Stream *> ss;
    {
        std::lock_guard<std::mutex> g(reg().mu);
        for (Stream *s : reg().all)
            if (dev < 0 || s->dev == dev) ss.push_back(s);
    }
    for (Stream *s : ss) {
        uint64_t last;
        {
            std::lock_guard<std::mutex> g(s->mu);
            last = s->last;
        }
        wait_done(s, last);
    }
}

// ---- the runtime's stream and event calls ----

cudaError_t zs_emu_stream_create(cudaStream_t *out, unsigned flags) {
    if (!out) return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> g(reg().mu);
    *out = (cudaStream_t)new_stream(zs_emu_current_device(), false, !(flags & cudaStreamNonBlocking));
    return cudaSuccess;
}

cudaError_t zs_emu_stream_destroy(cudaStream_t h) {
    Stream *s = (Stream *)h;
    if (!h || !known(s)) return cudaErrorInvalidResourceHandle;
    uint64_t last;
    {
        std::lock_guard<std::mutex> g(s->mu);
        last = s->last;
    }
    wait_done(s, last);
    std::lock_guard<std::mutex> g(s->mu);
    s->destroyed = true;
    s->cv.notify_all();
    return cudaSuccess;
}

cudaError_t zs_emu_stream_sync(cudaStream_t h) {
    Stream *s = resolve(h);
    if (h && h != cudaStreamLegacy && !known(s)) return cudaErrorInvalidResourceHandle;
    uint64_t last;
    {
        std::lock_guard<std::mutex> g(s->mu);
        last = s->last;
    }
    wait_done(s, last);
    return cudaSuccess;
}

cudaError_t zs_emu_stream_query(cudaStream_t h) {
    Stream *s = resolve(h);
    if (h && h != cudaStreamLegacy && !known(s)) return cudaErrorInvalidResourceHandle;
    std::lock_guard<std::mutex> g(s->mu);
    if (s->last > s->released) {
        s->released = s->last;
        s->cv.notify_all();
    }
    return s->done >= s->last ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t zs_emu_event_record(zs_emu_event *e, cudaStream_t h) {
    Stream *s = resolve(h);
    if (h && h != cudaStreamLegacy && !known(s)) return cudaErrorInvalidResourceHandle;
    order_legacy(s);
    auto st = std::make_shared<zs_emu_event_state>();
    Item it;
    it.op.what = "cudaEventRecord";
    it.stamp = st;
    uint64_t seq = push(s, std::move(it));
    std::lock_guard<std::mutex> g(e->mu);
    e->stream = s;
    e->seq = seq;
    e->state = st;
    return cudaSuccess;
}

static bool event_target(zs_emu_event *e, Stream **s, uint64_t *seq) {
    std::lock_guard<std::mutex> g(e->mu);
    if (!e->stream) return false;
    *s = (Stream *)e->stream;
    *seq = e->seq;
    return true;
}

cudaError_t zs_emu_event_sync(zs_emu_event *e) {
    Stream *s;
    uint64_t seq;
    if (event_target(e, &s, &seq)) wait_done(s, seq);
    return cudaSuccess;
}

cudaError_t zs_emu_event_query(zs_emu_event *e) {
    Stream *s;
    uint64_t seq;
    if (!event_target(e, &s, &seq)) return cudaSuccess;
    release(s, seq);
    std::lock_guard<std::mutex> g(s->mu);
    return s->done >= seq ? cudaSuccess : cudaErrorNotReady;
}

int zs_emu_event_done(zs_emu_event *e) {
    Stream *s;
    uint64_t seq;
    if (!event_target(e, &s, &seq)) return 1;
    std::lock_guard<std::mutex> g(s->mu);
    return s->done >= seq;
}

cudaError_t zs_emu_stream_wait_event(cudaStream_t h, zs_emu_event *e) {
    Stream *s = resolve(h);
    if (h && h != cudaStreamLegacy && !known(s)) return cudaErrorInvalidResourceHandle;
    Stream *w;
    uint64_t seq;
    if (!event_target(e, &w, &seq)) return cudaSuccess; // never recorded: nothing to wait for
    order_legacy(s);
    Item it;
    it.op.what = "cudaStreamWaitEvent";
    it.wait_s = w;
    it.wait_seq = seq;
    push(s, std::move(it));
    return cudaSuccess;
}
