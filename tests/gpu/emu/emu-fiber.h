// emu-fiber.h — cooperative fibers for the emulated device's threads: a stack of their own and a
// switch that saves only what the C ABI says a call keeps (x86-64: hand-written; elsewhere
// ucontext, slower). AddressSanitizer is told about every switch, so it follows the fibers'
// stacks. Not thread-safe: a fiber runs on the OS thread that made it.
#pragma once
#include <stddef.h>

struct zs_fiber {
    void *sp;          // saved stack pointer (x86-64) while switched out
    void *uctx;        // ucontext_t (other machines)
    char *stack;       // the fiber's stack, stack_size bytes, a guard page below
    size_t stack_size;
    void *asan_fake;   // AddressSanitizer's fake-stack handle while switched out
    size_t stagger;    // bytes left unused at the top, so that the stacks' hot lines differ
};

// Prepares f to run fn(arg) on its stack at the next switch into it (fn must never return: it
// ends by switching away for the last time with zs_fiber_exit).
void zs_fiber_prepare(zs_fiber *f, void (*fn)(void *), void *arg);
// Saves the current context into `from` and runs `to`.
void zs_fiber_switch(zs_fiber *from, zs_fiber *to);
// The last switch of a fiber that has finished: its stack is never resumed.
void zs_fiber_exit(zs_fiber *from, zs_fiber *to);
// Call first thing in a fiber's function and after every zs_fiber_switch returns (ASan).
void zs_fiber_arrived(zs_fiber *self);
// Stacks: allocated with a guard page, kept for reuse by the calling OS thread.
int zs_fiber_stack(zs_fiber *f, size_t bytes);
void zs_fiber_stack_free(zs_fiber *f);
