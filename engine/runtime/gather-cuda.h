/* gather-cuda.h — what gather-cuda.c's device operations could not return: the ready and retire
 * hooks of zs_gather_dev (gather.h) return void, so when their cudaStreamWaitEvent /
 * cudaEventRecord (or cudaSetDevice) fails, gather-cuda.c makes the ordering safe with a host
 * wait, logs the error, and keeps it for the thread that called the hook: the compute thread,
 * inside the weight source's acquire and release. The forward pass (forward-cuda.c) takes it
 * after each acquire/release and fails the step with it. No CUDA types; built with CUDA only.
 * Thread-safety: the kept error is per thread (thread-local); nothing is shared. */
#ifndef ZS_GATHER_CUDA_H
#define ZS_GATHER_CUDA_H

/* 0, or the code of the first ready/retire failure on this thread since the last call, with its
 * message set again (zs_errmsg); the kept error is then forgotten. */
int zs_dev_gather_take_error(void);

#endif
