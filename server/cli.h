/* cli.h — command-line flag parsing for the zeroserve subcommands: "--name value" and
 * "--name=value" pairs checked against a table, with strict number parsing and messages that
 * name the flag. Not thread-safe (used once at start-up). */
#ifndef ZS_CLI_H
#define ZS_CLI_H

#include <stdint.h>

enum { ZS_OPT_STR, ZS_OPT_INT, ZS_OPT_I64, ZS_OPT_U64, ZS_OPT_FLOAT, ZS_OPT_FLAG, ZS_OPT_LIST };

/* The destination of a repeatable string flag (ZS_OPT_LIST): each occurrence appends its value
 * (pointing into argv) to v[0..n); more than max occurrences is an error naming the flag. */
typedef struct {
    const char **v;
    int n, max;
} zs_opt_list;

typedef struct {
    const char *name;  /* without the leading "--" */
    int type;
    void *dst;         /* const char **, int *, int64_t *, uint64_t *, float *, int * (flag),
                          zs_opt_list * (list) */
    const char *help;
} zs_opt;

/* Parses argv[0..argc) into the table. Unknown flags, missing values and malformed numbers are
 * errors (message via zs_errmsg). */
int zs_cli_parse(int argc, char **argv, const zs_opt *opts, int n_opts);
void zs_cli_usage(const char *cmd, const char *summary, const zs_opt *opts, int n_opts);

#endif
