/* cli.c — strict "--flag value" parsing for the zeroserve command line. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static int parse_value(const zs_opt *o, const char *v) {
    char *end;
    errno = 0;
    switch (o->type) {
    case ZS_OPT_STR: *(const char **)o->dst = v; return 0;
    case ZS_OPT_LIST: {
        zs_opt_list *l = o->dst;
        if (l->n >= l->max) return zs_err(ZS_EINVAL, "--%s: given more than %d times", o->name, l->max);
        l->v[l->n++] = v;
        return 0;
    }
    case ZS_OPT_INT: {
        long x = strtol(v, &end, 10);
        if (errno || *end || end == v || x < -2147483647L || x > 2147483647L)
            return zs_err(ZS_EINVAL, "--%s: '%s' is not an integer", o->name, v);
        *(int *)o->dst = (int)x;
        return 0;
    }
    case ZS_OPT_I64: {
        long long x = strtoll(v, &end, 10);
        if (errno || *end || end == v) return zs_err(ZS_EINVAL, "--%s: '%s' is not an integer", o->name, v);
        *(int64_t *)o->dst = x;
        return 0;
    }
    case ZS_OPT_U64: {
        if (v[0] == '-') return zs_err(ZS_EINVAL, "--%s: '%s' must not be negative", o->name, v);
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || *end || end == v) return zs_err(ZS_EINVAL, "--%s: '%s' is not an integer", o->name, v);
        *(uint64_t *)o->dst = x;
        return 0;
    }
    case ZS_OPT_FLOAT: {
        float x = strtof(v, &end);
        if (errno || *end || end == v || !isfinite(x))
            return zs_err(ZS_EINVAL, "--%s: '%s' is not a number", o->name, v);
        *(float *)o->dst = x;
        return 0;
    }
    default: return zs_err(ZS_EINVAL, "--%s takes no value", o->name);
    }
}

int zs_cli_parse(int argc, char **argv, const zs_opt *opts, int n_opts) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0)
            return zs_err(ZS_EINVAL, "unexpected argument '%s' (flags start with --)", a);
        a += 2;
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const zs_opt *o = NULL;
        for (int k = 0; k < n_opts; k++)
            if (strlen(opts[k].name) == len && !strncmp(opts[k].name, a, len)) o = &opts[k];
        if (!o) return zs_err(ZS_EINVAL, "unknown flag --%.*s (see --help)", (int)len, a);
        if (o->type == ZS_OPT_FLAG) {
            if (eq) return zs_err(ZS_EINVAL, "--%s takes no value", o->name);
            *(int *)o->dst = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) return zs_err(ZS_EINVAL, "--%s needs a value", o->name);
        ZS_CHECK(parse_value(o, v));
    }
    return 0;
}

void zs_cli_usage(const char *cmd, const char *summary, const zs_opt *opts, int n_opts) {
    fprintf(stderr, "usage: zeroserve %s [flags]\n%s\n\nflags:\n", cmd, summary);
    for (int k = 0; k < n_opts; k++)
        fprintf(stderr, "  --%-20s %s\n", opts[k].name, opts[k].help);
}
