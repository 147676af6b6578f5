/* convert-cmd.c — `zeroserve convert --model HF_DIR --out FILE.gguf --dtype TYPE`: a Hugging Face
 * model directory as a GGUF v3 file that llama.cpp (and `zeroserve --model FILE.gguf`) loads, as
 * convert_hf_to_gguf.py and llama-quantize would write it (engine/runtime/convert.c). This file
 * has the flags, removes the temporary file when the command is interrupted, and reports what was
 * written. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "convert.h"

int zs_cmd_convert(int argc, char **argv);

/* An interrupted conversion leaves no temporary file behind. */
static char tmp_path[4200];
static void on_signal(int sig) {
    if (tmp_path[0]) unlink(tmp_path);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_tmp(const char *path, void *ud) {
    (void)ud;
    if (!path) {
        tmp_path[0] = 0;
        return;
    }
    snprintf(tmp_path, sizeof tmp_path, "%s", path);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
}

/* What was written: the tensors whose type is not the file type's, then one summary line. */
static void report(const char *out, zs_llama_ftype ft, const zs_convert_result *r) {
    size_t n = zs_gguf_conv_count(r->plan), counts[ZS_GGML_TYPE_COUNT] = {0};
    for (size_t i = 0; i < n; i++) {
        const zs_gguf_conv_tensor *t = zs_gguf_conv_at(r->plan, i);
        counts[t->type]++;
        if (t->note) fprintf(stderr, "convert: %s: %s\n", t->name, t->note);
    }
    char types[256] = "";
    for (int k = 0; k < ZS_GGML_TYPE_COUNT; k++)
        if (counts[k])
            snprintf(types + strlen(types), sizeof types - strlen(types), "%s%s %zu", types[0] ? ", " : "",
                     zs_gguf_type_name(k), counts[k]);
    const zs_model_config *g = zs_gguf_conv_config(r->plan);
    fflush(stderr);
    printf("wrote %s: GGUF v3, %s, %d layers, dim %d, vocab %d (%s tokenizer%s), file type %s; %zu tensors (%s), "
           "%.2f MB of tensor data\n", out, zs_gguf_conv_arch(r->plan), g->n_layers, g->dim, g->vocab_size, r->vocab,
           r->n_unused ? ", padded" : "", zs_llama_ftype_name(ft), n, types, zs_gguf_conv_data_bytes(r->plan) / 1e6);
}

int zs_cmd_convert(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *dtype = "f16", *name = NULL;
    zs_opt opts[] = {
        {"model", ZS_OPT_STR, &model, "Hugging Face model directory (config.json, *.safetensors, tokenizer.json)  [required]"},
        {"out", ZS_OPT_STR, &out, "output GGUF file  [required]"},
        {"dtype", ZS_OPT_STR, &dtype, "f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | q4_k_m (default f16)"},
        {"name", ZS_OPT_STR, &name, "general.name (default: the model directory's name)"},
    };
    int n_opts = sizeof opts / sizeof opts[0];
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            zs_cli_usage("convert", "Writes a Hugging Face model directory as a GGUF file that llama.cpp loads "
                         "(convert_hf_to_gguf.py, and llama-quantize for the 4- and 5-bit types).", opts, n_opts);
            return 0;
        }
    ZS_CHECK(zs_cli_parse(argc, argv, opts, n_opts));
    if (!model || !out) return zs_err(ZS_EINVAL, "--model and --out are required");
    zs_llama_ftype ft;
    if (zs_llama_ftype_parse(dtype, &ft) < 0) return zs_err_prefix(ZS_EINVAL, "--dtype");
    struct stat sb;
    if (stat(out, &sb) == 0 && S_ISDIR(sb.st_mode))
        return zs_err(ZS_EINVAL, "--out %s is a directory; give the path of the GGUF file to write", out);
    signal(SIGXFSZ, SIG_IGN); /* a file size limit is a write error (EFBIG), reported and cleaned up */
    zs_convert_opts o = {.model_dir = model, .out_path = out, .ftype = ft, .name = name, .on_tmp = on_tmp};
    zs_convert_result r;
    ZS_CHECK(zs_convert_run(&o, &r));
    report(out, ft, &r);
    zs_gguf_conv_close(r.plan);
    return 0;
}
