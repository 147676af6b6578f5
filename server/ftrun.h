/* ftrun.h — the fine-tuning job runner (ftrun.c), started and stopped by the job routes
 * (ftjobs.c). Not a public interface. */
#ifndef ZS_FTRUN_H
#define ZS_FTRUN_H

#include "ftjobs-internal.h"

/* Loads a model directory and serves it under name, to owner's tenant only (NULL: to every tenant;
 * zs_api_add_model) (ftrun.c). */
int  zs_ftjobs_serve_model(zs_ftjobs *J, const char *name, const char *owner, const char *dir);
/* The runner thread (ftrun.c). */
void *zs_ftjobs_runner_main(void *arg);

#endif
