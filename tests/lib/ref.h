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

#include "model.h"
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

/* The JSON document at path; NULL with a message on stderr. */
json_t *tu_ref_json(const char *path);

/* One case of a reference's "cases", handed to a tu_case_fn. */
typedef struct {
    const tu_ref *ref; /* the reference */
    json_t *cs;        /* the case */
    size_t index;      /* its place in "cases" */
    const char *name;  /* its "name" */
    const char *dir;   /* its model, regenerated there (tu_ref_regen) */
    char line[256];    /* a line for the summary printed after the last case (empty: none) */
} tu_ref_case;
typedef void (*tu_case_fn)(tu_ref_case *c, void *ctx);

/* Loads json_path and its floats (tu_ref_load), then for every entry of its "cases" (only the one
 * named only when only is neither NULL nor empty) regenerates the case's model in a scratch
 * directory /tmp/zs-TAG-... (tu_ref_regen; script named in a failure) and calls fn; then prints the
 * cases' summary lines on stderr and removes the scratch directory. 0, or -1 (with a message)
 * when the reference or the scratch directory cannot be had. */
int tu_ref_run(const char *json_path, const char *bin_path, const char *tag, const char *script, const char *only,
               tu_case_fn fn, void *ctx);

/* The recorded batch of a training reference (tests/ref/stories260K-train.json and the like,
 * make_train_ref.py): its "tokens" and "targets" rows [B][T] into tok and tgt, its "adamw" settings
 * into *adam; returns the document for the rest (the caller json_decref's it), or NULL with a
 * message on stderr. */
json_t *tu_ref_batch(const char *path, int B, int T, int32_t *tok, int32_t *tgt, zs_adamw_params *adam);

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

/* The base model a LoRA reference was made on (tests/ref/lora-peft, lora-grad: make_lora_ref.py,
 * make_lora_grad_ref.py), regenerated into dir from the document's "init_model_args" and, when flag
 * is not NULL, FLAG VALUE after them (e.g. "--dim", "128": another base). 0, or the error with a
 * message on stderr. tu_ref_lora_base_open also opens it (its resident weights loaded when
 * resident is 1); NULL on failure, with a message. The caller frees the model (zs_model_free). */
int tu_ref_lora_base(json_t *ref, const char *dir, const char *flag, const char *value);
zs_model *tu_ref_lora_base_open(json_t *ref, const char *dir, const char *flag, const char *value, int resident);

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
