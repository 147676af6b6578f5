/* export-cmd.c — `zeroserve export --merge --model BASE_DIR --lora ADAPTER_DIR --out OUT_DIR`: a
 * LoRA adapter (PEFT's format) folded into its base and written as a plain Hugging Face model
 * directory that `generate`, `serve` and transformers load without the adapter. The work is
 * zs_lora_merge_export (engine/model/lora-merge.c); `zeroserve export` (train-cmd.c) hands its
 * arguments here when --merge is among them. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "lora.h"

int zs_cmd_export_merge(int argc, char **argv);

int zs_cmd_export_merge(int argc, char **argv) {
    const char *model = NULL, *lora = NULL, *out = NULL;
    int merge = 0;
    zs_opt opts[] = {
        {"merge", ZS_OPT_FLAG, &merge, "merge a LoRA adapter into its base (this form of export)  [required]"},
        {"model", ZS_OPT_STR, &model, "the base model: a Hugging Face directory (config.json + safetensors)  [required]"},
        {"lora", ZS_OPT_STR, &lora, "the adapter directory (adapter_config.json + adapter_model.safetensors)  [required]"},
        {"out", ZS_OPT_STR, &out, "output model directory; an existing one is replaced only if empty or a previous "
                                  "merge  [required]"},
    };
    int n_opts = sizeof opts / sizeof opts[0];
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            zs_cli_usage("export --merge",
                         "Writes BASE with the LoRA adapter merged in (W += scale*B*A) as a Hugging Face model directory.",
                         opts, n_opts);
            return 0;
        }
    ZS_CHECK(zs_cli_parse(argc, argv, opts, n_opts));
    if (!model || !lora || !out) return zs_err(ZS_EINVAL, "export --merge: --model, --lora and --out are required");
    ZS_CHECK(zs_lora_merge_export(model, lora, out));
    fprintf(stderr, "export: %s merged into %s -> %s\n", lora, model, out);
    return 0;
}
