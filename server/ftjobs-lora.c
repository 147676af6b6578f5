/* ftjobs-lora.c — a fine-tuning job's "lora" object ({r, alpha, dropout, target_modules}) and
 * the defaults a job gets from its base model (ftjobs-internal.h), shared by the routes (ftjobs.c)
 * and the runner (ftrun.c), which both sit above it. Thread-safe (reads the base's immutable
 * configuration only). */
#include "engine.h"
#include "ftjobs-internal.h"
#include "lora.h"

json_t *zs_ftjobs_lora_json(int r, double alpha, double dropout, unsigned targets) {
    json_t *tm = json_array();
    for (int t = 0; t < ZS_LORA_NT; t++)
        if (targets & (1u << t)) json_array_append_new(tm, json_string(zs_lora_target_name(t)));
    return json_pack("{s:i,s:f,s:f,s:o}", "r", r, "alpha", alpha, "dropout", dropout, "target_modules", tm);
}

json_t *zs_ftjobs_lora_default(zs_engine *base) {
    return zs_ftjobs_lora_json(16, 32, 0,
                               base ? zs_lora_default_targets(zs_model_config_get(zs_engine_model(base))) : ZS_LORA_ALL);
}

json_t *zs_ftjobs_lora_auto(zs_engine *base) {
    zs_model *m = zs_engine_model(base);
    int big = zs_model_param_count(m) >= FT_LORA_DEFAULT_PARAMS, quant = zs_model_quant_dtype(m) != ZS_DTYPE_COUNT;
    return big || quant ? zs_ftjobs_lora_default(base) : json_null();
}
