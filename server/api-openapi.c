/* api-openapi.c — GET /openapi.json: the OpenAPI 3.1 document of every route the server
 * registers (their bodies, answers, errors and the role each needs, as x-zeroserve-role). The
 * document is server/openapi.json, embedded at build time as a byte array (the Makefile's
 * gen/openapi.c) and served as it is, with no key needed (like /health). tests/test-openapi.c
 * checks it against the routes registered (zs_http_routes). */
#include <stddef.h>

#include "api.h"

extern const unsigned char zs_openapi_json[];
extern const size_t zs_openapi_json_len;

static void h_openapi(void *ud, zs_http_req *r) {
    (void)ud;
    zs_http_respond(r, 200, "application/json", (const char *)zs_openapi_json, zs_openapi_json_len);
}

const char *zs_api_openapi_json(size_t *len) {
    if (len) *len = zs_openapi_json_len;
    return (const char *)zs_openapi_json;
}

int zs_api_openapi_route(zs_http *h) {
    return zs_http_route(h, "GET", "/openapi.json", ZS_ROLE_NONE, h_openapi, NULL);
}
