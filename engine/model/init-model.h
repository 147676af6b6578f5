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
    int random_norms;     /* norms 1 + 0.1·N(0,1) (Gemma: 0.1·N(0,1)) and biases 0.02·N(0,1) instead of
                             1 (0) and 0: for reference checks that must see every tensor */
} zs_init_opts;

/* Defaults for an architecture ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3",
 * "gpt2", or the mixtures of experts "mixtral" (8 experts, top-2), "qwen2moe" (16, top-4, a shared
 * expert), "qwen3moe" (16, top-4, renormalised) and "olmoe" (16, top-4)): a small model with the
 * family's ratios; sizes may then be changed (then pass the config through zs_config_override to
 * re-derive what follows from them; a MoE model's layer_moe[] must then cover the layers). The
 * tensors carry transformers' names (Mixtral: block_sparse_moe.gate / experts.E.w1, w2, w3; the
 * others: mlp.gate / mlp.experts.E.{gate,up,down}_proj, Qwen2-MoE's mlp.shared_expert.* and
 * mlp.shared_expert_gate; dense layers of Qwen-MoE: mlp.{gate,up,down}_proj). */
int zs_init_opts_default(const char *arch, zs_init_opts *o);
/* Writes the model into dir (created if missing). Files are written atomically; the same
 * options and seed give byte-identical files. */
int zs_init_model_write(const zs_init_opts *o, const char *dir);

#endif
