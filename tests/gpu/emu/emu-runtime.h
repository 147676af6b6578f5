// emu-runtime.h — between the runtime's API (emu-runtime.cc) and its streams (emu-stream.cc):
// the event object and the stream calls the API forwards to. Tests only.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <mutex>

struct zs_emu_event_state {
    double ms = 0; // when the record ran (CLOCK_MONOTONIC, milliseconds)
};

struct zs_emu_event {
    std::mutex mu;
    unsigned flags = 0;
    void *stream = nullptr; // the stream of the last record (NULL: never recorded)
    uint64_t seq = 0;
    std::shared_ptr<zs_emu_event_state> state;
};

void zs_emu_set_device_of_thread(int dev);
cudaError_t zs_emu_stream_create(cudaStream_t *out, unsigned flags);
cudaError_t zs_emu_stream_destroy(cudaStream_t s);
cudaError_t zs_emu_stream_sync(cudaStream_t s);
cudaError_t zs_emu_stream_query(cudaStream_t s);
cudaError_t zs_emu_stream_wait_event(cudaStream_t s, zs_emu_event *e);
cudaError_t zs_emu_event_record(zs_emu_event *e, cudaStream_t s);
cudaError_t zs_emu_event_sync(zs_emu_event *e);
cudaError_t zs_emu_event_query(zs_emu_event *e);
int zs_emu_event_done(zs_emu_event *e);
