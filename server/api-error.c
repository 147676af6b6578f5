/* api-error.c — the error a request is answered with (api-error.h): zs_api_fail fills it.
 * Shared by every API file; it calls none of them. */
#include "api-error.h"

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
