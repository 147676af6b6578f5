/* llamacpp.h — zeroserve against llama.cpp's own outputs on the same GGUF weights, as the
 * reference scripts recorded them with llama-cpp-python (tests/ref/make_llamacpp_ref.py,
 * make_family_llamacpp_ref.py, moe-llamacpp/make_ref.py): the case's model made and converted
 * here into the very file llama.cpp ran, zeroserve's engine opened on it the way every comparison
 * opens it, and the comparison of greedy decoding step by step (ids, the logits at llama.cpp's top
 * ids, the logsumexp, the prompt's last logits row) and of the features a case measured. Used by
 * test-peer-llamacpp.c and test-moe-gguf.c. The checks count with the test program's own
 * (testutil.h). Not thread-safe. */
#ifndef ZS_TEST_LLAMACPP_H
#define ZS_TEST_LLAMACPP_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "testmodel.h"

/* zeroserve's engine on path (a GGUF file or a model directory) as the comparisons open it: on the
 * CPU, one sequence of up to 512 positions, weights at wd (NULL or "auto": as stored; "q4_k_m":
 * the Q4_K_M mix, as --weight-dtype q4_k_m; else a dtype name). NULL on failure (a failed check
 * naming the case). The caller frees it (zs_engine_free). */
zs_engine *tu_lc_open(const char *name, const char *path, const char *wd);

/* zeroserve's greedy decoding of the prompt ids p (at most n_new tokens): every logits row it
 * hands out appended to *lg, its result in *res (the caller frees lg->rows and res->ids). */
int tu_lc_greedy(zs_engine *e, const int32_t *p, size_t np, int n_new, tu_logit_log *lg, zs_gen_result *res);

/* The checkpoint of case c in tmp/NAME as `zeroserve init-model --arch A --random-norms --seed S
 * [--init-std X] --set JSON` writes it, converted into tmp/NAME.gguf (its path into gguf) as
 * `zeroserve convert --dtype D --name zs-peer` does; then the file must be the one llama.cpp ran
 * (the case's "gguf_checksum" over 64-bit words; script: the reference's maker, named in the
 * failure). 0, or the error of init-model or convert (a failed check). */
int tu_lc_make_gguf(json_t *c, const char *tmp, const char *script, char *gguf, size_t n);

/* zeroserve's greedy decoding of p against llama.cpp's case c ("ids", "steps" of {top_ids,
 * top_logits, logsumexp}, and "last_logits" when the case has it): the prompt's last logits row
 * (all of it) within tol; the ids step by step until a near tie of llama.cpp's own top two (within
 * 2 tol, where either engine may pick either) or both stop at the end of the sequence, and at every
 * compared step the logits at llama.cpp's top ids and the logsumexp within tol (NaN fails); at
 * least min_steps steps compared (or all of them without a near tie). Prints one line. */
void tu_lc_compare(const char *label, zs_engine *e, const int32_t *p, size_t np, json_t *c, double tol, int min_steps);

/* Every feature the case measured (its "features": {what, delta}) moved llama.cpp's own logits by
 * at least margin * tol: else the case could not tell an engine without it. */
void tu_lc_features(const char *name, json_t *c, double tol, double margin);

#endif
