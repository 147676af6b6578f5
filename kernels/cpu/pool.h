/* pool.h — a small process-wide pool of worker threads for the CPU kernels. A job is split into
 * n independent tasks; the caller works too, and returns when all tasks are done. Which thread
 * runs a task never changes its result (tasks write disjoint outputs), so results do not depend
 * on the thread count. Thread-safe: concurrent jobs from several rank threads take turns. */
#ifndef ZS_POOL_H
#define ZS_POOL_H

typedef void (*zs_pool_fn)(void *arg, int task);

/* Runs fn(arg, 0..n-1). Threads: ZS_THREADS env, else the online CPUs; idle workers spin
 * ZS_POOL_SPIN_US (default 200, 0 to sleep at once) before they sleep. */
void zs_pool_run(zs_pool_fn fn, void *arg, int n);
int  zs_pool_threads(void);

#endif
