/* api-error.h — the error a request is answered with (api-error.c): an HTTP status, OpenAI's
 * error type and code, the field at fault and a message; api-openai.c turns it into OpenAI's error
 * shape. The bottom of the API files: the request parser, the tools and the extra routes fill it.
 * Not a public interface. An api_err belongs to one request; the calls are thread-safe. */
#ifndef ZS_API_ERROR_H
#define ZS_API_ERROR_H

#include <jansson.h>

typedef struct api_err {
    int status;           /* HTTP status */
    const char *type;     /* "invalid_request_error", "rate_limit_error" (429), "server_error" (5xx) */
    const char *code;     /* OpenAI's code ("invalid_type", ...), or NULL */
    char param[96];       /* the field at fault, "" when none */
    char msg[600];
} api_err;

/* Fills e (type from the status, param NULL: none, the message printf-style); returns -1. */
int zs_api_fail(api_err *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* 400 invalid_type: "Invalid type for 'name': expected <want>, but got <v's type> instead."; -1. */
int zs_api_bad_type(api_err *e, const char *name, const char *want, const json_t *v);
const char *zs_api_json_type(const json_t *v); /* "an object", "an array", "a string", ..., "null" */

#endif
