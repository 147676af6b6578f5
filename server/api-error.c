/* api-error.c — the error a request is answered with (api-error.h): zs_api_fail fills it, and
 * zs_api_bad_type words a field of the wrong JSON type as OpenAI does. Shared by the API files;
 * it calls none of them. */
#include "api-error.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>

int zs_api_fail(api_err *e, int status, const char *param, const char *code, const char *fmt, ...) {
    e->status = status;
    e->type = status == 429 ? "rate_limit_error"
              : status >= 500 ? "server_error"
                              : "invalid_request_error";
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

const char *zs_api_json_type(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

int zs_api_bad_type(api_err *e, const char *name, const char *want, const json_t *v) {
    return zs_api_fail(e, 400, name, "invalid_type", "Invalid type for '%s': expected %s, but got %s instead.",
                       name, want, zs_api_json_type(v));
}
