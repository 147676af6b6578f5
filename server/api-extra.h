/* api-extra.h — the routes beside the OpenAI generation ones (api-extra.c): POST /tokenize,
 * POST /detokenize (llama.cpp's and vLLM's shapes) and POST /v1/embeddings (OpenAI's). The
 * handlers take the zs_api as ud and are registered by zs_api_new (api-openai.c). Not a public
 * interface. Thread-safety: the handlers run on the HTTP threads; embedding requests are
 * answered from the scheduler's engine thread. */
#ifndef ZS_API_EXTRA_H
#define ZS_API_EXTRA_H

#include "http.h"

void zs_api_h_tokenize(void *ud, zs_http_req *r);
void zs_api_h_detokenize(void *ud, zs_http_req *r);
void zs_api_h_embeddings(void *ud, zs_http_req *r);

/* The pooling /v1/embeddings uses when a request gives no "pooling": ZS_POOL_MEAN (the default)
 * or ZS_POOL_LAST (sched.h); serve --pooling sets it. Process-wide; thread-safe. */
void zs_api_set_default_pooling(int pooling);
int  zs_api_default_pooling(void);

#endif
