/* ref.h — readers of the reference data the scripts under tests/ref/ record (make_*.py, moe/,
 * moe-grad/; transformers, PyTorch, PEFT): a JSON document with its float32 array, token ids and
 * the token rows of a recorded batch, AdamW's settings, a model regenerated from a case's
 * init-model flags (checked against the recorded checksum), and gradients against their recorded
 * entries. The checks count with the test program's own (testutil.h).
 * Ownership: tu_ref_load's document and array belong to the tu_ref until tu_ref_free; the ids of
 * tu_ref_ids_dup to the caller (free). Not thread-safe (CHECK's counters). */
#ifndef ZS_TEST_REF_H
#define ZS_TEST_REF_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "optim.h"

typedef struct {
    json_t *doc; /* the JSON document */
    float *bin;  /* its float32 array */
    long nbin;   /* floats in bin */
} tu_ref;

/* Loads json_path and its float32 array: all of bin_path when bin_path is not NULL, else the file
 * that the document's "bin" names, next to json_path, which must hold the document's "bin_floats"
 * floats. 0, or -1 with a message on stderr (*r then holds nothing to free). */
int tu_ref_load(tu_ref *r, const char *json_path, const char *bin_path);
void tu_ref_free(tu_ref *r);

/* The integers of the JSON array a (at most cap of them) into out; returns the array's length. */
int tu_ref_ids(json_t *a, int32_t *out, int cap);
/* The rows [B][T] of integers of the JSON array rows into out[B * T]. */
void tu_ref_rows(json_t *rows, int B, int T, int32_t *out);
/* A malloc'd copy of the integers of a (length *n); NULL when a is empty or memory ran out. */
int32_t *tu_ref_ids_dup(json_t *a, size_t *n);
/* AdamW's settings as the reference scripts record them: {lr, beta1, beta2, eps, weight_decay}. */
void tu_ref_adamw(json_t *a, zs_adamw_params *p);

/* Regenerates case cs's model into dir exactly as `zeroserve init-model <init_args> --out dir`
 * does, and checks that its model.safetensors has the recorded "safetensors_checksum" (32-bit
 * words, testmodel.h); script: the reference's maker, named in the failure. Returns init-model's
 * status (checked); a checksum mismatch is a failed check, not an error. */
int tu_ref_regen(json_t *cs, const char *dir, const char *script);

/* Our gradient of the Hugging Face tensor name into out (at most cap floats): its element count,
 * or -1 when the name maps to nothing. */
typedef long (*tu_grad_fn)(void *ctx, const char *name, float *out, long cap);

typedef struct {
    double worst;           /* the largest relative error (NaN counts as the largest) */
    const char *worst_name; /* its tensor */
    long total;             /* elements compared */
} tu_grad_sum;

/* Every tensor of the reference's list ts (entries: name, numel, offset into bin, argmax, norm,
 * and full: every element recorded) through get against its entry: the relative error of its L2
 * norm and the relative L2 error of the recorded elements (all of them when "full" is true, else
 * the largest, at argmax, and n_sample elements at indices drawn by the reference scripts' LCG,
 * seeded with the tensor's index + 1); the larger of the two within tol (CHECK; label names the
 * case). ZS_VERBOSE=1 prints every tensor. Fills *sum. */
void tu_ref_grads(const char *label, json_t *ts, int n_sample, const float *bin, long nbin, tu_grad_fn get, void *ctx,
                  double tol, tu_grad_sum *sum);

#endif
