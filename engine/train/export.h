/* export.h — writes a training run's fp32 weights as a plain Hugging Face model directory
 * (internal to engine/train: train.c's zs_training_export_dtype; the test builds the source itself).
 *
 * The weights come bucket by bucket from the caller (zs_export_src.get: the bucket's fp32 data
 * area in storage-element order, every rank's master shard) plus the resident fp32 masters. The
 * writer is STREAMED: a first pass over the buckets' slots (no data) finds every output tensor
 * (zs_model_slot_source: name, shape, how each slot was cut from it), its first and its last
 * contributing bucket; the tensors are declared to the safetensors writer in the order in which
 * they complete (by last bucket, then first appearance); then each bucket in turn is fetched and
 * every tensor whose last bucket it is goes to the file, converted to the output dtype (round to
 * nearest even). A tensor that lies within one bucket is converted straight from the bucket's data
 * through a small scratch; only a tensor that spans buckets is assembled in an fp32 buffer, held
 * from its first bucket to its last. So the writer holds one bucket's fp32 data, the scratch, and
 * the spanning tensors still waiting for a later bucket (zs_train_export_peak_bytes measures it).
 *
 * Directory: out_dir.tmp is made afresh, gets model.safetensors (metadata {"format": "pt",
 * "zeroserve": "fine-tuned", "dtype": "float32" | "float16" | "bfloat16"}), config.json (copied
 * byte for byte, or, when its "torch_dtype" / "dtype" does not name the output dtype, rewritten by
 * jansson in the file's key order with those keys set to it; torch_dtype added when neither is
 * there and the output is not F32, what a missing one means), tokenizer.json and the optional
 * tokenizer_config.json, generation_config.json, special_tokens_map.json; then out_dir is replaced
 * by it (the old one is moved to out_dir.tmp-old first, then removed). On any error out_dir.tmp is
 * removed and out_dir is left as it was.
 *
 * Several processes (collective 1): every process calls zs_train_export_write with the same
 * arguments; get() is then a collective, called by every process for every bucket in the same
 * order. Failures before the first get() (memory, the directory, the config, the safetensors
 * header) are agreed on by every process (zs_cluster_min_int) and returned by all of them before
 * any get(). After that a failing writer still calls get() for every remaining bucket (the others
 * wait in the gathers), then fails; a failing get() ends the export at once on that process.
 *
 * Thread-safety: one call at a time per thread; the peak figure is per thread. */
#ifndef ZS_TRAIN_EXPORT_H
#define ZS_TRAIN_EXPORT_H

#include <stddef.h>

#include "model.h"

/* Fills full (room for zs_export_src.max_full floats) with bucket b's fp32 data area in
 * storage-element order (element k of the packed data area, whose slots sit at byte offset
 * slot.offset, is full[k]: slot data at full + slot.offset / dsize). 0, or an error code with
 * zs_err set. In a multi-process run a collective (see above). */
typedef int (*zs_export_bucket_fn)(void *ud, int bucket, float *full);

typedef struct {
    const zs_model *m;
    int n_buckets;                   /* zs_model_n_buckets(m) */
    size_t max_full;                 /* floats of the largest full bucket (shard * ranks) */
    size_t dsize;                    /* bytes of one storage element (f32 4, f16/bf16 2) */
    const float *const *rmaster;     /* [bucket] the resident fp32 masters (glayout order; NULL for a
                                        bucket without resident slots); may be NULL when writer is 0 */
    zs_export_bucket_fn get;
    void *ud;
    int writer;                      /* 1: this process writes; 0: only takes part in the gathers */
    int collective;                  /* 1: several processes (get is a collective); 0: one process */
} zs_export_src;

/* dtype ZS_F32, ZS_F16 or ZS_BF16, or ZS_DTYPE_COUNT: the base checkpoint's own dtype
 * (zs_train_export_base_dtype of zs_model_dir(m)). Errors: ZS_EINVAL (arguments, a dtype other
 * than those, a path with a single quote), ZS_EUNSUPPORTED (a model whose slots cannot be named
 * as Hugging Face tensors, e.g. one loaded from GGUF), ZS_EFORMAT (a slot that does not fit its
 * source tensor), ZS_EIO / ZS_ENOTFOUND naming the file, ZS_ENOMEM, or get()'s error. */
int zs_train_export_write(const zs_export_src *s, const char *out_dir, zs_dtype dtype);

/* The dtype a safetensors checkpoint directory stores: the dtype holding the most bytes of its
 * matrices (tensors of 2 or more dimensions; of all tensors when it has none); a tie goes to the
 * wider type (F32, then BF16, then F16). */
int zs_train_export_base_dtype(const char *dir, zs_dtype *out);

/* Bytes of weight data the last zs_train_export_write of this thread held at its peak: the
 * bucket buffer (max_full fp32), the conversion scratch, and the fp32 buffers of tensors that
 * span buckets. */
size_t zs_train_export_peak_bytes(void);
/* Bytes of the conversion scratch at the current chunk size (fp32 + 16-bit elements). */
size_t zs_train_export_scratch_bytes(void);
/* Test hooks, per thread: elements converted per chunk (0: the default, 16384); 1: every tensor
 * assembled in an fp32 buffer as a tensor spanning buckets is (0: only those). */
void zs_train_export_set_chunk(size_t elems);
void zs_train_export_set_buffered(int on);

#endif
