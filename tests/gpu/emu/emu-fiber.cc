// emu-fiber.cc — the fibers of emu-fiber.h: the x86-64 switch in a few instructions (callee-saved
// registers, the SSE and x87 control words), ucontext elsewhere; stacks from mmap with a guard
// page; AddressSanitizer's fiber hooks when the process runs under it (weak symbols: one build
// of the emulator serves plain and sanitized test programs).
#include "emu-fiber.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

extern "C" {
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size) __attribute__((weak));
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old)
    __attribute__((weak));
void __asan_unpoison_memory_region(void const volatile *addr, size_t size) __attribute__((weak));
}

static thread_local zs_fiber *came_from; // the fiber switched away from, for its stack bounds (ASan)

static void asan_leave(zs_fiber *from, zs_fiber *to, int exiting) {
    came_from = from;
    if (__sanitizer_start_switch_fiber)
        __sanitizer_start_switch_fiber(exiting ? nullptr : &from->asan_fake, to->stack, to->stack_size);
}

void zs_fiber_arrived(zs_fiber *self) {
    if (!__sanitizer_finish_switch_fiber) return;
    const void *bottom = nullptr;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(self->asan_fake, &bottom, &size);
    // the OS thread's own stack is not ours: learn its bounds the first time we leave it
    if (came_from && !came_from->stack) {
        came_from->stack = (char *)bottom;
        came_from->stack_size = size;
        came_from->asan_fake = nullptr;
    }
}

#if defined(__x86_64__)
extern "C" void zs_fiber_swap(void **save_sp, void *load_sp);
extern "C" void zs_fiber_trampoline(void);
// zs_fiber_swap(save, load): push the callee-saved registers, save rsp, load the other stack,
// pop its registers and return into it. A new fiber's stack is laid out so that this "returns"
// into zs_fiber_trampoline with r12 = the argument, r13 = the function. The SSE and x87 control
// words are not switched (loading them is slow): every fiber of a thread runs with the thread's.
__asm__(".text\n"
        ".globl zs_fiber_swap\n"
        ".hidden zs_fiber_swap\n"
        ".type zs_fiber_swap,@function\n"
        "zs_fiber_swap:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size zs_fiber_swap, .-zs_fiber_swap\n"
        ".globl zs_fiber_trampoline\n"
        ".hidden zs_fiber_trampoline\n"
        ".type zs_fiber_trampoline,@function\n"
        "zs_fiber_trampoline:\n"
        "  movq %r12, %rdi\n"
        "  xorl %ebp, %ebp\n"
        "  callq *%r13\n"
        "  ud2\n"
        ".size zs_fiber_trampoline, .-zs_fiber_trampoline\n");

void zs_fiber_prepare(zs_fiber *f, void (*fn)(void *), void *arg) {
    if (__asan_unpoison_memory_region) __asan_unpoison_memory_region(f->stack, f->stack_size);
    uintptr_t top = ((uintptr_t)f->stack + f->stack_size - f->stagger) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 56); // 7 words: r15, r14, r13, r12, rbx, rbp, the return address
    memset(sp, 0, 56);
    sp[2] = (uint64_t)(uintptr_t)fn;  // r13
    sp[3] = (uint64_t)(uintptr_t)arg; // r12
    sp[6] = (uint64_t)(uintptr_t)zs_fiber_trampoline;
    // after the ret, rsp = top: 16-byte aligned at the trampoline's call, as the ABI wants
    f->sp = sp;
}

void zs_fiber_switch(zs_fiber *from, zs_fiber *to) {
    asan_leave(from, to, 0);
    zs_fiber_swap(&from->sp, to->sp);
    zs_fiber_arrived(from);
}

void zs_fiber_exit(zs_fiber *from, zs_fiber *to) {
    asan_leave(from, to, 1);
    zs_fiber_swap(&from->sp, to->sp);
    abort(); // never resumed
}
#else
#include <ucontext.h>

static ucontext_t *uc(zs_fiber *f) {
    if (!f->uctx) f->uctx = calloc(1, sizeof(ucontext_t));
    return (ucontext_t *)f->uctx;
}

void zs_fiber_prepare(zs_fiber *f, void (*fn)(void *), void *arg) {
    if (__asan_unpoison_memory_region) __asan_unpoison_memory_region(f->stack, f->stack_size);
    ucontext_t *u = uc(f);
    getcontext(u);
    u->uc_stack.ss_sp = f->stack;
    u->uc_stack.ss_size = f->stack_size;
    u->uc_link = nullptr;
    // makecontext passes ints: split the pointers
    uintptr_t a = (uintptr_t)arg, g = (uintptr_t)fn;
    makecontext(u, (void (*)())+[](unsigned ah, unsigned al, unsigned gh, unsigned gl) {
        void *p = (void *)(((uintptr_t)ah << 32) | al);
        void (*h)(void *) = (void (*)(void *))(((uintptr_t)gh << 32) | gl);
        h(p);
    }, 4, (unsigned)(a >> 32), (unsigned)a, (unsigned)(g >> 32), (unsigned)g);
}

void zs_fiber_switch(zs_fiber *from, zs_fiber *to) {
    asan_leave(from, to, 0);
    swapcontext(uc(from), uc(to));
    zs_fiber_arrived(from);
}

void zs_fiber_exit(zs_fiber *from, zs_fiber *to) {
    asan_leave(from, to, 1);
    swapcontext(uc(from), uc(to));
    abort();
}
#endif

int zs_fiber_stack(zs_fiber *f, size_t bytes) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    bytes = (bytes + pg - 1) / pg * pg;
    char *m = (char *)mmap(nullptr, bytes + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return -1;
    mprotect(m, pg, PROT_NONE); // a stack overflow faults instead of writing into the next stack
    f->stack = m + pg;
    f->stack_size = bytes;
    // stacks of equal size all start their hot lines at the same cache sets: spread them
    static thread_local unsigned k;
    f->stagger = (size_t)(k++ % 61) * 64;
    return 0;
}

void zs_fiber_stack_free(zs_fiber *f) {
    if (!f->stack) return;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    munmap(f->stack - pg, f->stack_size + pg);
    f->stack = nullptr;
    free(f->uctx);
    f->uctx = nullptr;
}
