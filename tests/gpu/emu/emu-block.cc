// emu-block.cc — runs a kernel's grid on the calling thread: the blocks one after another, the
// threads of a block as fibers (emu-fiber.h) under a round-robin scheduler. A thread runs until it
// waits at __syncthreads, at a warp operation, or ends. The barrier opens when every thread that
// has not ended waits at it. A warp operation completes when every lane of its mask has reached
// it with the same mask and kind; then each lane's result is computed at once (shuffles read the
// values deposited, not live registers). What CUDA leaves undefined is a fault here: a lane
// calling with a mask that leaves it out, a mask naming a lane that does not exist or has ended,
// lanes of one mask at different operations, a shuffle reading a lane outside the mask, and a
// block where nobody can move (deadlock). The dynamic shared memory of a block is an allocation
// of exactly the launch's size, poisoned, with a guard after it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "cuda-emu.h"
#include "emu-fiber.h"
#include "emu-internal.h"

extern "C" {
void __asan_poison_memory_region(void const volatile *addr, size_t size) __attribute__((weak));
void __asan_unpoison_memory_region(void const volatile *addr, size_t size) __attribute__((weak));
}

thread_local const zs_emu_thread *zs_emu_cur;

namespace {

enum { L_RUN, L_BAR, L_WARP, L_DONE };

struct Lane {
    zs_fiber f;
    zs_emu_thread t;
    int state;
    int bar_result;
    int w_mode, w_arg, w_width;
    unsigned w_mask;
    uint64_t w_val, w_res;
};

struct Block {
    const zs_emu_grid *g;
    Lane *lanes;
    int n;          // threads
    int live;       // not ended
    int at_bar;     // waiting at the barrier
    int bar_kind, bar_acc;
    int cur;        // the lane running now
    unsigned waiting[32]; // per warp: the lanes waiting in a warp operation
    zs_fiber sched; // the scheduler's own context (the OS thread's stack)
    unsigned char *dyn;
};

const size_t GUARD = 64;
thread_local Block *cur_block;
thread_local std::vector<Lane> lane_pool; // stacks kept for the next block of this OS thread

size_t stack_bytes() {
    static size_t n = [] {
        const char *e = getenv("ZS_EMU_STACK_KB");
        long kb = e ? atol(e) : 0;
        return (size_t)(kb > 16 ? kb : 256) * 1024;
    }();
    return n;
}

bool reverse_order() {
    static bool r = [] {
        const char *e = getenv("ZS_EMU_ORDER");
        return e && !strcmp(e, "reverse");
    }();
    return r;
}

const char *mode_name(int m) {
    switch (m) {
    case ZS_EMU_SHFL_IDX: return "__shfl_sync";
    case ZS_EMU_SHFL_XOR: return "__shfl_xor_sync";
    case ZS_EMU_SHFL_DOWN: return "__shfl_down_sync";
    case ZS_EMU_SHFL_UP: return "__shfl_up_sync";
    case ZS_EMU_BALLOT: return "__ballot_sync";
    default: return "__syncwarp";
    }
}

std::string where(const Block *b) {
    char s[160];
    snprintf(s, sizeof s, "kernel %s, block (%u,%u,%u) of (%u,%u,%u), %d threads", b->g->name,
             b->lanes[0].t.bid.x, b->lanes[0].t.bid.y, b->lanes[0].t.bid.z, b->g->grid.x, b->g->grid.y,
             b->g->grid.z, b->n);
    return s;
}

// what every thread is doing, as runs of threads in the same state
std::string states(const Block *b) {
    std::string out;
    int i = 0;
    while (i < b->n) {
        const Lane &l = b->lanes[i];
        int j = i + 1;
        while (j < b->n && b->lanes[j].state == l.state &&
               (l.state != L_WARP || (b->lanes[j].w_mask == l.w_mask && b->lanes[j].w_mode == l.w_mode)))
            j++;
        char s[160];
        const char *st = l.state == L_BAR ? "wait at __syncthreads"
                         : l.state == L_DONE ? "have ended"
                         : l.state == L_RUN ? "can run"
                                            : mode_name(l.w_mode);
        if (l.state == L_WARP)
            snprintf(s, sizeof s, "%sthreads %d-%d wait in %s (mask 0x%08x)", out.empty() ? "" : "; ", i, j - 1, st,
                     l.w_mask);
        else
            snprintf(s, sizeof s, "%sthreads %d-%d %s", out.empty() ? "" : "; ", i, j - 1, st);
        out += s;
        i = j;
    }
    return out;
}

void lane_main(void *arg) {
    Lane *l = (Lane *)arg;
    zs_fiber_arrived(&l->f);
    Block *b = cur_block;
    zs_emu_cur = &l->t;
    b->g->body();
    l->state = L_DONE;
    b->live--;
    zs_fiber_exit(&l->f, &b->sched);
}

// a lane that ended while others of its warp wait for it in a warp operation
void check_ended(Block *b, int i) {
    int w0 = i & ~31, ln = i & 31;
    for (int j = w0; j < w0 + 32 && j < b->n; j++) {
        const Lane &o = b->lanes[j];
        if (o.state == L_WARP && (o.w_mask >> ln & 1))
            zs_emu_fault("%s: thread %d ended while thread %d waits for it in %s (mask 0x%08x)", where(b).c_str(), i,
                         j, mode_name(o.w_mode), o.w_mask);
    }
}

void open_barrier(Block *b) {
    if (b->at_bar == 0 || b->at_bar != b->live) return;
    int r = b->bar_acc;
    for (int i = 0; i < b->n; i++)
        if (b->lanes[i].state == L_BAR) {
            b->lanes[i].state = L_RUN;
            b->lanes[i].bar_result = r;
        }
    b->at_bar = 0;
}

void run_block(Block *b) {
    bool rev = reverse_order();
    for (;;) {
        bool moved = false;
        for (int k = 0; k < b->n; k++) {
            int i = rev ? b->n - 1 - k : k;
            Lane *l = &b->lanes[i];
            if (l->state != L_RUN) continue;
            b->cur = i;
            zs_emu_cur = &l->t;
            zs_fiber_switch(&b->sched, &l->f);
            moved = true;
            if (l->state == L_DONE) check_ended(b, i);
            open_barrier(b);
        }
        if (b->live == 0) return;
        if (!moved) zs_emu_fault("%s: deadlock: %s", where(b).c_str(), states(b).c_str());
    }
}

} // namespace

int zs_emu_barrier(int kind, int pred) {
    Block *b = cur_block;
    Lane *me = &b->lanes[b->cur];
    if (b->at_bar == 0) {
        b->bar_kind = kind;
        b->bar_acc = kind == ZS_EMU_BAR_AND ? 1 : 0;
    } else if (b->bar_kind != kind) {
        zs_emu_fault("%s: threads wait at different kinds of block barrier (__syncthreads%s and __syncthreads%s): %s",
                     where(b).c_str(), b->bar_kind == ZS_EMU_BAR_PLAIN ? "" : "_or/_and/_count",
                     kind == ZS_EMU_BAR_PLAIN ? "" : "_or/_and/_count", states(b).c_str());
    }
    switch (kind) {
    case ZS_EMU_BAR_OR: b->bar_acc |= pred; break;
    case ZS_EMU_BAR_AND: b->bar_acc &= pred; break;
    case ZS_EMU_BAR_COUNT: b->bar_acc += pred; break;
    default: break;
    }
    me->state = L_BAR;
    b->at_bar++;
    zs_fiber_switch(&me->f, &b->sched);
    zs_emu_cur = &me->t;
    return me->bar_result;
}

uint64_t zs_emu_warp(int mode, unsigned mask, uint64_t v, int arg, int width) {
    Block *b = cur_block;
    int i = b->cur, w0 = i & ~31, ln = i & 31;
    int wn = b->n - w0 < 32 ? b->n - w0 : 32; // lanes in this warp (the last one may be partial)
    Lane *me = &b->lanes[i];
    const char *op = mode_name(mode);
    if (!(mask >> ln & 1))
        zs_emu_fault("%s: thread %d calls %s with mask 0x%08x, which leaves its own lane %d out", where(b).c_str(), i,
                     op, mask, ln);
    if (wn < 32 && (mask >> wn))
        zs_emu_fault("%s: thread %d calls %s with mask 0x%08x, but its warp has only %d lanes", where(b).c_str(), i, op,
                     mask, wn);
    if (mode != ZS_EMU_SYNCWARP && mode != ZS_EMU_BALLOT && (width < 1 || width > 32 || (width & (width - 1))))
        zs_emu_fault("%s: thread %d calls %s with width %d (a power of two up to 32)", where(b).c_str(), i, op, width);
    me->w_mode = mode;
    me->w_mask = mask;
    me->w_val = v;
    me->w_arg = arg;
    me->w_width = width;
    me->state = L_WARP;
    unsigned &waiting = b->waiting[i >> 5];
    waiting |= 1u << ln;
    if ((waiting & mask) != mask) { // others of the mask still to come
        zs_fiber_switch(&me->f, &b->sched);
        zs_emu_cur = &me->t;
        return me->w_res;
    }
    // every lane of the mask is here: all at the same operation?
    for (int j = 0; j < wn; j++) {
        if (!(mask >> j & 1)) continue;
        const Lane &o = b->lanes[w0 + j];
        if (o.w_mask != mask || o.w_mode != mode)
            zs_emu_fault("%s: lanes of one warp at different warp operations: thread %d in %s (mask 0x%08x), thread "
                         "%d in %s (mask 0x%08x)",
                         where(b).c_str(), i, op, mask, w0 + j, mode_name(o.w_mode), o.w_mask);
    }
    uint64_t ballot = 0;
    if (mode == ZS_EMU_BALLOT)
        for (int j = 0; j < wn; j++)
            if ((mask >> j & 1) && b->lanes[w0 + j].w_val) ballot |= 1ull << j;
    for (int j = 0; j < wn; j++) {
        if (!(mask >> j & 1)) continue;
        Lane &o = b->lanes[w0 + j];
        uint64_t r = 0;
        if (mode == ZS_EMU_BALLOT) {
            r = ballot;
        } else if (mode != ZS_EMU_SYNCWARP) {
            int wd = o.w_width, base = j & ~(wd - 1), src = j;
            switch (mode) {
            case ZS_EMU_SHFL_IDX: src = base + (((o.w_arg % wd) + wd) % wd); break;
            case ZS_EMU_SHFL_XOR: src = j ^ o.w_arg; if (src < 0 || src >= base + wd) src = j; break;
            case ZS_EMU_SHFL_DOWN: src = j + o.w_arg; if (src >= base + wd) src = j; break;
            case ZS_EMU_SHFL_UP: src = j - o.w_arg; if (src < base) src = j; break;
            }
            if (src >= wn || !(mask >> src & 1))
                zs_emu_fault("%s: thread %d's %s (mask 0x%08x) reads lane %d, which is not in the mask",
                             where(b).c_str(), w0 + j, op, mask, src);
            r = b->lanes[w0 + src].w_val;
        }
        o.w_res = r;
        o.state = L_RUN;
    }
    waiting &= ~mask;
    return me->w_res;
}

void *zs_emu_dyn_smem(void) { return cur_block ? cur_block->dyn : nullptr; }

void zs_emu_run_grid(const zs_emu_grid &g) {
    int n = (int)(g.block.x * g.block.y * g.block.z);
    if (lane_pool.size() < (size_t)n) {
        size_t old = lane_pool.size();
        lane_pool.resize((size_t)n);
        for (size_t i = old; i < (size_t)n; i++) {
            lane_pool[i] = Lane{};
            if (zs_fiber_stack(&lane_pool[i].f, stack_bytes()) != 0)
                zs_emu_fault("kernel %s: cannot map a stack for thread %zu of %d", g.name, i, n);
        }
    }
    Block b;
    memset(&b, 0, sizeof b);
    b.g = &g;
    b.lanes = lane_pool.data();
    b.n = n;
    unsigned char *dyn = nullptr;
    if (g.smem) {
        dyn = (unsigned char *)malloc(g.smem + GUARD);
        if (!dyn) zs_emu_fault("kernel %s: cannot allocate %zu bytes of dynamic shared memory", g.name, g.smem);
    }
    size_t nblocks = (size_t)g.grid.x * g.grid.y * g.grid.z;
    bool rev = reverse_order();
    Block *saved = cur_block;
    const zs_emu_thread *saved_t = zs_emu_cur;
    cur_block = &b;
    for (size_t k = 0; k < nblocks; k++) {
        size_t bi = rev ? nblocks - 1 - k : k;
        uint3 bid;
        bid.x = (unsigned)(bi % g.grid.x);
        bid.y = (unsigned)(bi / g.grid.x % g.grid.y);
        bid.z = (unsigned)(bi / ((size_t)g.grid.x * g.grid.y));
        if (dyn) {
            if (__asan_unpoison_memory_region) __asan_unpoison_memory_region(dyn, g.smem + GUARD);
            memset(dyn, 0xff, g.smem + GUARD); // uninitialised shared memory reads as NaN
            if (__asan_poison_memory_region) __asan_poison_memory_region(dyn + g.smem, GUARD);
        }
        b.dyn = dyn;
        for (int i = 0; i < n; i++) {
            Lane &l = b.lanes[i];
            l.state = L_RUN;
            l.t.tid.x = (unsigned)(i % g.block.x);
            l.t.tid.y = (unsigned)(i / g.block.x % g.block.y);
            l.t.tid.z = (unsigned)(i / (g.block.x * g.block.y));
            l.t.bid = bid;
            l.t.bdim = g.block;
            l.t.gdim = g.grid;
            zs_fiber_prepare(&l.f, lane_main, &l);
        }
        b.live = n;
        b.at_bar = 0;
        memset(b.waiting, 0, sizeof b.waiting);
        run_block(&b);
        if (dyn) {
            if (__asan_unpoison_memory_region) __asan_unpoison_memory_region(dyn + g.smem, GUARD);
            for (size_t i = 0; i < GUARD; i++)
                if (dyn[g.smem + i] != 0xff)
                    zs_emu_fault("kernel %s, block (%u,%u,%u): wrote past the end of its %zu bytes of dynamic shared "
                                 "memory (byte %zu)",
                                 g.name, bid.x, bid.y, bid.z, g.smem, g.smem + i);
        }
    }
    cur_block = saved;
    zs_emu_cur = saved_t;
    free(dyn);
}
