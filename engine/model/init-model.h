/* init-model.h — writes a randomly initialised model of any size in Hugging Face layout
 * (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
 * generation_config.json) for benchmarks and as the default model of a fresh machine. */
#ifndef ZS_INIT_MODEL_H
#define ZS_INIT_MODEL_H

#include <stdint.h>

#include "config.h"

typedef struct {
    zs_model_config cfg;  /* arch, arch_name, sizes, eps, theta, tied, biases, dtype */
    uint64_t seed;
    float init_std;       /* standard deviation of the normal init of matrices (default 0.02) */
} zs_init_opts;

/* Defaults for an architecture ("llama" or "gpt2"): a small model; sizes may then be changed. */
int zs_init_opts_default(const char *arch, zs_init_opts *o);
/* Writes the model into dir (created if missing). Files are written atomically; the same
 * options and seed give byte-identical files. */
int zs_init_model_write(const zs_init_opts *o, const char *dir);

#endif
