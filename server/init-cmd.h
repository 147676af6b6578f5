/* init-cmd.h — `zeroserve init-model`'s command line as zs_init_opts (init-cmd.c). */
#ifndef ZS_INIT_CMD_H
#define ZS_INIT_CMD_H

#include "init-model.h"

/* Parses init-model's flags (argv without the command name) into *io (the family's defaults, the
 * sizes and flags given, then --rope-scaling / --sliding-window / --set put through the config.json
 * parser) and *out (--out; required). --help prints the usage and sets *help (nothing else is
 * done). Errors name the flag or config key. Thread-safe. */
int zs_init_cmd_parse(int argc, char **argv, zs_init_opts *io, const char **out, int *help);

#endif
