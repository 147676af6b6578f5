/* test-dsconfig.c — DeepSpeed-style config parsing (engine/dsconfig.c): a realistic ZeRO-3 +
 * NVMe file, "auto" and 5e8 values, merge semantics, every wrong-type / impossible-value case
 * (the message must name the full dotted key), unknown keys reported once each, the issue-16
 * keys (fp16 loss scaling, offload_optimizer.{pin_memory, buffer_count}, sub_group_size, the
 * 16-bit save and its two spellings), every accepted-but-ignored key reported exactly once with
 * what zeroserve does instead, zs_zero_opts_report_unused per command (engine / train / jobs)
 * and per cross-field condition, file errors, the --offload flag parser and the batch-size rule. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "dsconfig.h"
#include "testutil.h"

/* Collects unknown-key reports. */
typedef struct {
    char keys[32][128];
    int n;
} unknowns;

static void on_unknown(void *ud, const char *origin, const char *key) {
    unknowns *u = ud;
    (void)origin;
    if (u->n < 32) snprintf(u->keys[u->n], sizeof u->keys[0], "%s", key);
    u->n++;
}

static int count_key(const unknowns *u, const char *key) {
    int c = 0;
    for (int i = 0; i < u->n && i < 32; i++) c += strcmp(u->keys[i], key) == 0;
    return c;
}

/* Collects accepted-but-ignored / unused reports, in order. */
#define MAXREP 96
typedef struct {
    char keys[MAXREP][128];
    char instead[MAXREP][320];
    char origin[MAXREP][64];
    int n;
} ignoreds;

static void on_ignored(void *ud, const char *origin, const char *key, const char *instead) {
    ignoreds *g = ud;
    if (g->n < MAXREP) {
        snprintf(g->keys[g->n], sizeof g->keys[0], "%s", key);
        snprintf(g->instead[g->n], sizeof g->instead[0], "%s", instead ? instead : "");
        snprintf(g->origin[g->n], sizeof g->origin[0], "%s", origin ? origin : "(null)");
    }
    g->n++;
}

/* Index of key among the reports (-1: absent); *count: how many times it was reported. */
static int find_ign(const ignoreds *g, const char *key, int *count) {
    int at = -1, c = 0;
    for (int i = 0; i < g->n && i < MAXREP; i++) {
        if (strcmp(g->keys[i], key) != 0) continue;
        if (at < 0) at = i;
        c++;
    }
    if (count) *count = c;
    return at;
}

/* Both report kinds of one parse. */
typedef struct {
    unknowns u;
    ignoreds g;
} reports;

static void rep_unknown(void *ud, const char *origin, const char *key) {
    on_unknown(&((reports *)ud)->u, origin, key);
}
static void rep_ignored(void *ud, const char *origin, const char *key, const char *instead) {
    on_ignored(&((reports *)ud)->g, origin, key, instead);
}

/* Parses text as "ds.json" (unknown and ignored keys collected, not logged). */
static int parse_r(const char *text, zs_zero_opts *o, reports *r) {
    memset(r, 0, sizeof *r);
    return zs_dsconfig_parse_rep(text, "ds.json", rep_unknown, rep_ignored, r, o);
}
static int parse(const char *text, zs_zero_opts *o) {
    static reports r; /* large: not on the stack */
    return parse_r(text, o, &r);
}

/* The ZeRO-3 + NVMe example of the DeepSpeed documentation, with the training blocks. */
static const char *full_config =
    "{\n"
    "  \"train_batch_size\": 64,\n"
    "  \"train_micro_batch_size_per_gpu\": 4,\n"
    "  \"gradient_accumulation_steps\": 8,\n"
    "  \"gradient_clipping\": 1.0,\n"
    "  \"steps_per_print\": 10,\n"
    "  \"wall_clock_breakdown\": false,\n"
    "  \"zero_allow_untested_optimizer\": true,\n"
    "  \"optimizer\": {\n"
    "    \"type\": \"adamw\",\n"
    "    \"params\": {\"lr\": 3e-5, \"betas\": [0.9, 0.95], \"eps\": 1e-8,\n"
    "               \"weight_decay\": 0.1, \"torch_adam\": false, \"adam_w_mode\": true}\n"
    "  },\n"
    "  \"scheduler\": {\n"
    "    \"params\": {\"warmup_min_ratio\": 0.0, \"warmup_num_steps\": 100,\n"
    "               \"total_num_steps\": 1000, \"cos_min_ratio\": 0.1,\n"
    "               \"warmup_type\": \"linear\"},\n"
    "    \"type\": \"WarmupCosineLR\"\n"
    "  },\n"
    "  \"bf16\": {\"enabled\": true},\n"
    "  \"fp16\": {\"enabled\": false, \"loss_scale\": 0, \"initial_scale_power\": 16},\n"
    "  \"zero_optimization\": {\n"
    "    \"stage\": 3,\n"
    "    \"contiguous_gradients\": true,\n"
    "    \"overlap_comm\": true,\n"
    "    \"reduce_bucket_size\": 5e8,\n"
    "    \"sub_group_size\": 1e9,\n"
    "    \"stage3_prefetch_bucket_size\": 5e8,\n"
    "    \"stage3_max_live_parameters\": 1e9,\n"
    "    \"stage3_max_reuse_distance\": 1e9,\n"
    "    \"stage3_param_persistence_threshold\": 1e6,\n"
    "    \"stage3_gather_16bit_weights_on_model_save\": true,\n"
    "    \"offload_param\": {\n"
    "      \"device\": \"nvme\",\n"
    "      \"nvme_path\": \"/local_nvme\",\n"
    "      \"pin_memory\": true,\n"
    "      \"buffer_count\": 5,\n"
    "      \"buffer_size\": 1e8,\n"
    "      \"max_in_cpu\": 1e9\n"
    "    },\n"
    "    \"offload_optimizer\": {\n"
    "      \"device\": \"nvme\",\n"
    "      \"nvme_path\": \"/local_nvme/opt\",\n"
    "      \"pin_memory\": true,\n"
    "      \"buffer_count\": 4,\n"
    "      \"fast_init\": false\n"
    "    }\n"
    "  },\n"
    "  \"aio\": {\n"
    "    \"block_size\": 1048576,\n"
    "    \"queue_depth\": 8,\n"
    "    \"thread_count\": 1,\n"
    "    \"single_submit\": false,\n"
    "    \"overlap_events\": true\n"
    "  }\n"
    "}\n";

static void test_full(void) {
    zs_zero_opts o;
    static reports r;
    int rc = parse_r(full_config, &o, &r);
    CHECK(rc == 0, "rc %d: %s", rc, zs_errmsg());
    if (rc) return;
    CHECK(r.u.n == 0, "%d unknown keys reported, first '%s'", r.u.n, r.u.keys[0]);
    /* the ignored keys of the file, each once, in file order */
    static const char *ign[] = {
        "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer",
        "optimizer.params.torch_adam", "zero_optimization.contiguous_gradients",
        "zero_optimization.overlap_comm", "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_max_reuse_distance", "zero_optimization.offload_param.max_in_cpu",
        "zero_optimization.offload_optimizer.fast_init", "aio.thread_count", "aio.single_submit",
        "aio.overlap_events"};
    int ni = (int)(sizeof ign / sizeof ign[0]);
    CHECK(r.g.n == ni, "%d ignored keys reported, expected %d", r.g.n, ni);
    for (int i = 0; i < ni && i < r.g.n; i++)
        CHECK(strcmp(r.g.keys[i], ign[i]) == 0 && r.g.instead[i][0] &&
                  strcmp(r.g.origin[i], "ds.json") == 0,
              "ignored report %d: '%s' (%s), expected '%s'", i, r.g.keys[i], r.g.origin[i], ign[i]);
    /* keys that were ignored before issue 16 and are parsed now */
    CHECK(o.loss_scale == 0.0f && o.initial_scale_power == 16, "fp16: %g %d", o.loss_scale,
          o.initial_scale_power);
    CHECK(o.sub_group_size == 1000000000, "%lld", (long long)o.sub_group_size);
    CHECK(o.gather_16bit_on_save == 1, "%d", o.gather_16bit_on_save);
    CHECK(o.optimizer_pin_memory == 1 && o.optimizer_buffer_count == 4, "%d %d",
          o.optimizer_pin_memory, o.optimizer_buffer_count);
    CHECK(o.loss_scale_window == 0 && o.hysteresis == 0 && o.consecutive_hysteresis == -1 &&
              isnan(o.min_loss_scale),
          "absent fp16 keys not unset");
    CHECK(o.zero_stage == 3, "%d", o.zero_stage);
    CHECK(o.offload_param == ZS_OFFLOAD_NVME, "%d", o.offload_param);
    CHECK(strcmp(o.nvme_path, "/local_nvme") == 0, "%s", o.nvme_path);
    CHECK(o.pin_memory == 1, "%d", o.pin_memory);
    CHECK(o.buffer_count == 5, "%d", o.buffer_count);
    CHECK(o.buffer_size == 100000000, "%lld", (long long)o.buffer_size);
    CHECK(o.offload_optimizer == ZS_OFFLOAD_NVME, "%d", o.offload_optimizer);
    CHECK(strcmp(o.optimizer_nvme_path, "/local_nvme/opt") == 0, "%s", o.optimizer_nvme_path);
    CHECK(o.prefetch_bucket_size == 500000000, "%lld", (long long)o.prefetch_bucket_size);
    CHECK(o.max_live_parameters == 1000000000, "%lld", (long long)o.max_live_parameters);
    CHECK(o.param_persistence_threshold == 1000000, "%lld",
          (long long)o.param_persistence_threshold);
    CHECK(o.aio_block_size == 1048576, "%lld", (long long)o.aio_block_size);
    CHECK(o.aio_queue_depth == 8, "%d", o.aio_queue_depth);
    CHECK(o.bf16 == 1 && o.fp16 == 0, "%d %d", o.bf16, o.fp16);
    CHECK(strcmp(o.optimizer_type, "AdamW") == 0, "%s", o.optimizer_type);
    CHECK(o.lr == 3e-5f && o.beta1 == 0.9f && o.beta2 == 0.95f, "%g %g %g", o.lr, o.beta1,
          o.beta2);
    CHECK(o.eps == 1e-8f && o.weight_decay == 0.1f, "%g %g", o.eps, o.weight_decay);
    CHECK(o.lr_schedule == ZS_LR_WARMUP_COSINE, "%d", o.lr_schedule);
    CHECK(o.warmup_type == ZS_WARMUP_LINEAR, "%d", o.warmup_type);
    CHECK(o.warmup_steps == 100 && o.total_steps == 1000, "%d %d", o.warmup_steps,
          o.total_steps);
    CHECK(o.warmup_min_ratio == 0.0f && o.cos_min_ratio == 0.1f, "%g %g", o.warmup_min_ratio,
          o.cos_min_ratio);
    CHECK(isnan(o.warmup_min_lr) && isnan(o.warmup_max_lr), "%g %g", o.warmup_min_lr,
          o.warmup_max_lr);
    CHECK(o.micro_batch == 4 && o.grad_accum == 8, "%d %d", o.micro_batch, o.grad_accum);
    CHECK(o.train_batch_size == 64, "%lld", (long long)o.train_batch_size);
    CHECK(o.grad_clip == 1.0f, "%g", o.grad_clip);
    CHECK(zs_zero_opts_check_batch(&o, 2) == 0, "%s", zs_errmsg());
    CHECK_ERR(zs_zero_opts_check_batch(&o, 3), "train_batch_size 64", "world size 3");

    /* The same text through a real file. */
    char dir[512], path[600];
    CHECK(tu_tmpdir(dir, sizeof dir, "dsconfig") == 0, "tmpdir");
    snprintf(path, sizeof path, "%s/ds.json", dir);
    CHECK(tu_write_file(path, full_config, strlen(full_config)) == 0, "write");
    zs_zero_opts f;
    memset(&r, 0, sizeof r);
    rc = zs_dsconfig_load_rep(path, rep_unknown, rep_ignored, &r, &f);
    CHECK(rc == 0, "rc %d: %s", rc, zs_errmsg());
    CHECK(r.g.n == ni && r.u.n == 0 && strcmp(r.g.origin[0], path) == 0, "load: %d reports",
          r.g.n);
    CHECK(rc == 0 && f.zero_stage == 3 && f.aio_queue_depth == 8 && f.bf16 == 1, "load");
    tu_rmdir(dir);
}

static void test_empty_and_auto(void) {
    zs_zero_opts o, ref;
    zs_zero_opts_init(&ref);
    int rc = parse("{}", &o);
    CHECK(rc == 0, "%s", zs_errmsg());
    CHECK(o.zero_stage == -1 && o.offload_param == -1 && o.nvme_path[0] == 0 &&
              o.pin_memory == -1 && o.buffer_count == 0 && o.buffer_size == 0 &&
              o.offload_optimizer == -1 && o.prefetch_bucket_size == -1 &&
              o.max_live_parameters == -1 && o.param_persistence_threshold == -1 &&
              o.aio_block_size == 0 && o.aio_queue_depth == 0 && o.bf16 == -1 && o.fp16 == -1,
          "zero fields not unset");
    CHECK(o.optimizer_type[0] == 0 && isnan(o.lr) && isnan(o.beta1) && isnan(o.beta2) &&
              isnan(o.eps) && isnan(o.weight_decay) && o.lr_schedule == -1 &&
              o.warmup_type == -1 && o.warmup_steps == -1 && o.total_steps == -1 &&
              o.micro_batch == 0 && o.grad_accum == 0 && isnan(o.grad_clip) &&
              o.train_batch_size == 0,
          "training fields not unset");
    CHECK(isnan(o.loss_scale) && o.initial_scale_power == -1 && o.loss_scale_window == 0 &&
              o.hysteresis == 0 && o.consecutive_hysteresis == -1 && isnan(o.min_loss_scale) &&
              o.optimizer_pin_memory == -1 && o.optimizer_buffer_count == 0 &&
              o.sub_group_size == 0 && o.gather_16bit_on_save == -1,
          "issue-16 fields not unset");
    CHECK(memcmp(&o, &ref, sizeof o) == 0, "parse of {} differs from zs_zero_opts_init");

    /* Hugging Face style: "auto" everywhere, nulls, empty blocks. */
    const char *hf =
        "{\"fp16\": {\"enabled\": \"auto\", \"loss_scale\": 0},"
        " \"bf16\": {\"enabled\": \"auto\"},"
        " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", \"betas\": \"auto\","
        "   \"eps\": \"auto\", \"weight_decay\": \"auto\"}},"
        " \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": \"auto\","
        "   \"warmup_max_lr\": \"auto\", \"warmup_num_steps\": \"auto\","
        "   \"total_num_steps\": \"auto\"}},"
        " \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\","
        "   \"pin_memory\": true}, \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true,"
        "   \"nvme_path\": null},"
        "   \"overlap_comm\": true, \"reduce_bucket_size\": \"auto\","
        "   \"stage3_prefetch_bucket_size\": \"auto\","
        "   \"stage3_param_persistence_threshold\": \"auto\","
        "   \"stage3_max_live_parameters\": 1e9},"
        " \"aio\": null,"
        " \"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\","
        " \"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\"}";
    rc = parse(hf, &o);
    CHECK(rc == 0, "%s", zs_errmsg());
    CHECK(o.zero_stage == 3 && o.offload_param == ZS_OFFLOAD_CPU &&
              o.offload_optimizer == ZS_OFFLOAD_CPU && o.pin_memory == 1,
          "stage %d offload %d/%d", o.zero_stage, o.offload_param, o.offload_optimizer);
    CHECK(o.max_live_parameters == 1000000000, "%lld", (long long)o.max_live_parameters);
    CHECK(o.prefetch_bucket_size == -1 && o.param_persistence_threshold == -1, "auto ints");
    CHECK(o.bf16 == -1 && o.fp16 == -1, "auto bools");
    CHECK(o.loss_scale == 0.0f && o.optimizer_pin_memory == 1, "fp16.loss_scale %g, "
          "offload_optimizer.pin_memory %d", o.loss_scale, o.optimizer_pin_memory);
    CHECK(strcmp(o.optimizer_type, "AdamW") == 0, "%s", o.optimizer_type);
    CHECK(isnan(o.lr) && isnan(o.beta1) && isnan(o.eps) && isnan(o.weight_decay), "auto floats");
    CHECK(o.lr_schedule == ZS_LR_WARMUP_LINEAR && o.warmup_steps == -1 && o.total_steps == -1 &&
              isnan(o.warmup_max_lr),
          "auto scheduler");
    CHECK(o.micro_batch == 0 && o.grad_accum == 0 && o.train_batch_size == 0 &&
              isnan(o.grad_clip),
          "auto batch");

    /* Integral reals, integral reals written with a fraction, 0/1 booleans. */
    rc = parse("{\"zero_optimization\": {\"stage\": 3.0, \"stage3_prefetch_bucket_size\": 5e8,"
               " \"offload_param\": {\"device\": \"CPU\", \"pin_memory\": 0,"
               " \"buffer_size\": 1.5e8}}, \"bf16\": {\"enabled\": 1},"
               " \"train_batch_size\": 2.56e2, \"scheduler\": {\"type\": \"WarmupLR\","
               " \"params\": {\"warmup_num_steps\": 1e3, \"warmup_max_lr\": 1e-4,"
               " \"warmup_type\": \"log\"}}}",
               &o);
    CHECK(rc == 0, "%s", zs_errmsg());
    CHECK(o.zero_stage == 3 && o.prefetch_bucket_size == 500000000 &&
              o.offload_param == ZS_OFFLOAD_CPU && o.pin_memory == 0 &&
              o.buffer_size == 150000000 && o.bf16 == 1 && o.train_batch_size == 256,
          "reals as integers");
    CHECK(o.lr_schedule == ZS_LR_CONSTANT && o.warmup_steps == 1000 &&
              o.warmup_type == ZS_WARMUP_LOG && o.warmup_max_lr == 1e-4f,
          "WarmupLR: %d %d %d %g", o.lr_schedule, o.warmup_steps, o.warmup_type,
          o.warmup_max_lr);

    /* bfloat16 is the legacy spelling of bf16. */
    rc = parse("{\"bfloat16\": {\"enabled\": true}}", &o);
    CHECK(rc == 0 && o.bf16 == 1, "bfloat16: %s", zs_errmsg());
}

static void test_merge(void) {
    zs_zero_opts file, cli, m;
    int rc = parse("{\"zero_optimization\": {\"stage\": 3,"
                   " \"offload_param\": {\"device\": \"nvme\","
                   " \"nvme_path\": \"/nvme\", \"buffer_count\": 4}},"
                   " \"aio\": {\"queue_depth\": 32},"
                   " \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.001}}}",
                   &file);
    CHECK(rc == 0, "%s", zs_errmsg());
    zs_zero_opts_init(&cli);
    cli.offload_param = ZS_OFFLOAD_CPU; /* --offload cpu */
    cli.buffer_count = 8;
    cli.lr = 0.5f;
    cli.micro_batch = 2;
    snprintf(cli.nvme_path, sizeof cli.nvme_path, "/other");

    /* defaults <- file <- flags */
    zs_zero_opts_init(&m);
    m.zero_stage = 3;
    m.max_live_parameters = 123;
    zs_zero_opts_merge(&m, &file);
    CHECK(m.zero_stage == 3 && m.offload_param == ZS_OFFLOAD_NVME && m.buffer_count == 4 &&
              m.aio_queue_depth == 32 && strcmp(m.nvme_path, "/nvme") == 0,
          "file merged");
    CHECK(m.max_live_parameters == 123, "unset file field overwrote a default: %lld",
          (long long)m.max_live_parameters);
    CHECK(strcmp(m.optimizer_type, "Adam") == 0 && m.lr == 0.001f && isnan(m.beta1), "optimizer");
    zs_zero_opts_merge(&m, &cli);
    CHECK(m.offload_param == ZS_OFFLOAD_CPU && m.buffer_count == 8 && m.lr == 0.5f &&
              m.micro_batch == 2 && strcmp(m.nvme_path, "/other") == 0,
          "flags win");
    CHECK(m.aio_queue_depth == 32 && m.zero_stage == 3, "file values kept");

    /* Merging an all-unset struct changes nothing. */
    zs_zero_opts before = m, none;
    zs_zero_opts_init(&none);
    zs_zero_opts_merge(&m, &none);
    CHECK(memcmp(&before, &m, sizeof m) == 0, "merge of unset changed dst");

    /* Explicit zeros / false are values, not "unset". */
    zs_zero_opts z;
    zs_zero_opts_init(&z);
    z.zero_stage = 0;
    z.pin_memory = 0;
    z.prefetch_bucket_size = 0;
    z.bf16 = 0;
    z.grad_clip = 0;
    zs_zero_opts_merge(&m, &z);
    CHECK(m.zero_stage == 0 && m.pin_memory == 0 && m.prefetch_bucket_size == 0 && m.bf16 == 0 &&
              m.grad_clip == 0,
          "zero values merged");

    /* Cross-field check after merging: stage 0 with param offload. */
    CHECK_ERR(zs_zero_opts_check(&m, "--config ds.json"), "--config ds.json",
              "zero_optimization.offload_param", "stage 3");
    m.zero_stage = 3;
    CHECK(zs_zero_opts_check(&m, NULL) == 0, "%s", zs_errmsg());
}

typedef struct {
    const char *json;
    const char *needle1, *needle2;
} bad_case;

static void test_bad_values(void) {
    static const bad_case cases[] = {
        {"{\"zero_optimization\": {\"offload_param\": {\"device\": \"gpu\"}}}",
         "ds.json: zero_optimization.offload_param.device: expected one of \"none\", \"cpu\", "
         "\"nvme\", got \"gpu\"", NULL},
        {"{\"zero_optimization\": {\"stage3_max_live_parameters\": -5}}",
         "ds.json: zero_optimization.stage3_max_live_parameters: expected a positive integer, "
         "got -5", NULL},
        {"{\"zero_optimization\": {\"stage\": \"three\"}}",
         "ds.json: zero_optimization.stage: expected an integer 0..3, got \"three\"", NULL},
        {"{\"zero_optimization\": {\"stage\": 4}}", "zero_optimization.stage", "got 4"},
        {"{\"zero_optimization\": {\"stage\": 2.5}}", "zero_optimization.stage", "got 2.5"},
        {"{\"zero_optimization\": {\"stage\": true}}", "zero_optimization.stage", "got true"},
        {"{\"zero_optimization\": 3}", "zero_optimization: expected an object", "got 3"},
        {"{\"zero_optimization\": {\"offload_param\": \"cpu\"}}",
         "zero_optimization.offload_param: expected an object", NULL},
        {"{\"zero_optimization\": {\"offload_param\": {\"device\": 1}}}",
         "zero_optimization.offload_param.device", "got 1"},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"disk\"}}}",
         "zero_optimization.offload_optimizer.device", "\"disk\""},
        {"{\"zero_optimization\": {\"offload_param\": {\"nvme_path\": 5}}}",
         "zero_optimization.offload_param.nvme_path: expected a string", NULL},
        {"{\"zero_optimization\": {\"offload_param\": {\"pin_memory\": \"yes\"}}}",
         "zero_optimization.offload_param.pin_memory: expected true or false", "\"yes\""},
        {"{\"zero_optimization\": {\"offload_param\": {\"pin_memory\": 2}}}",
         "zero_optimization.offload_param.pin_memory", "got 2"},
        {"{\"zero_optimization\": {\"offload_param\": {\"buffer_count\": 0}}}",
         "zero_optimization.offload_param.buffer_count: expected a positive integer", NULL},
        {"{\"zero_optimization\": {\"offload_param\": {\"buffer_count\": 3e10}}}",
         "zero_optimization.offload_param.buffer_count", "no larger than 2147483647"},
        {"{\"zero_optimization\": {\"offload_param\": {\"buffer_size\": 1.5}}}",
         "zero_optimization.offload_param.buffer_size", "got 1.5"},
        {"{\"zero_optimization\": {\"offload_param\": {\"buffer_size\": 1e300}}}",
         "zero_optimization.offload_param.buffer_size", "positive integer"},
        {"{\"zero_optimization\": {\"stage3_prefetch_bucket_size\": -1}}",
         "zero_optimization.stage3_prefetch_bucket_size: expected a non-negative integer",
         "got -1"},
        {"{\"zero_optimization\": {\"stage3_param_persistence_threshold\": [1]}}",
         "zero_optimization.stage3_param_persistence_threshold", "got [1]"},
        {"{\"zero_optimization\": {\"stage3_max_live_parameters\": 0}}",
         "zero_optimization.stage3_max_live_parameters", "got 0"},
        {"{\"aio\": {\"block_size\": 1000000}}", "aio.block_size: expected a power of two",
         "got 1000000"},
        {"{\"aio\": {\"block_size\": 2048}}", "aio.block_size", "got 2048"},
        {"{\"aio\": {\"block_size\": 134217728}}", "aio.block_size", "67108864"},
        {"{\"aio\": {\"queue_depth\": 0}}", "aio.queue_depth: expected an integer 1..4096", NULL},
        {"{\"aio\": {\"queue_depth\": 5000}}", "aio.queue_depth", "got 5000"},
        {"{\"bf16\": {\"enabled\": \"true\"}}", "bf16.enabled: expected true or false", NULL},
        {"{\"fp16\": {\"enabled\": 1.0}}", "fp16.enabled", "got 1"},
        {"{\"bf16\": {\"enabled\": true}, \"fp16\": {\"enabled\": true}}", "bf16.enabled",
         "fp16.enabled"},
        {"{\"optimizer\": {\"type\": \"Lamb\"}}",
         "optimizer.type: expected one of \"Adam\", \"AdamW\", got \"Lamb\"", NULL},
        {"{\"optimizer\": {\"params\": {\"lr\": \"fast\"}}}", "optimizer.params.lr", "\"fast\""},
        {"{\"optimizer\": {\"params\": {\"lr\": -0.1}}}", "optimizer.params.lr", "got -0.1"},
        {"{\"optimizer\": {\"params\": {\"eps\": 0}}}",
         "optimizer.params.eps: expected a number > 0", NULL},
        {"{\"optimizer\": {\"params\": {\"weight_decay\": -1}}}", "optimizer.params.weight_decay",
         NULL},
        {"{\"optimizer\": {\"params\": {\"betas\": [0.9]}}}", "optimizer.params.betas", "[0.9]"},
        {"{\"optimizer\": {\"params\": {\"betas\": [0.9, 1.0]}}}", "optimizer.params.betas",
         "[0, 1)"},
        {"{\"optimizer\": {\"params\": {\"betas\": [0.9, \"x\"]}}}", "optimizer.params.betas",
         NULL},
        {"{\"optimizer\": {\"params\": {\"adam_w_mode\": false}}}", "optimizer.params.adam_w_mode",
         "AdamW"},
        {"{\"optimizer\": {\"params\": {\"amsgrad\": true}}}", "optimizer.params.amsgrad", NULL},
        {"{\"optimizer\": {\"params\": \"auto\"}}", "optimizer.params: expected an object", NULL},
        {"{\"scheduler\": {\"type\": \"OneCycle\"}}", "scheduler.type: expected one of",
         "\"OneCycle\""},
        {"{\"scheduler\": {\"params\": {\"warmup_num_steps\": -3}}}",
         "scheduler.params.warmup_num_steps", "got -3"},
        {"{\"scheduler\": {\"params\": {\"total_num_steps\": 0}}}",
         "scheduler.params.total_num_steps", "positive"},
        {"{\"scheduler\": {\"params\": {\"warmup_type\": \"exp\"}}}",
         "scheduler.params.warmup_type: expected one of \"linear\", \"log\"", NULL},
        {"{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"cos_min_ratio\": 2}}}",
         "scheduler.params.cos_min_ratio", "got 2"},
        {"{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_num_steps\": 100,"
         " \"total_num_steps\": 50}}}",
         "scheduler.params.total_num_steps", "warmup_num_steps (100)"},
        {"{\"train_micro_batch_size_per_gpu\": 0}", "train_micro_batch_size_per_gpu", "got 0"},
        {"{\"gradient_accumulation_steps\": \"8\"}", "gradient_accumulation_steps", "\"8\""},
        {"{\"gradient_clipping\": -1.0}", "gradient_clipping: expected a number >= 0", NULL},
        {"{\"train_batch_size\": 1e19}", "train_batch_size", NULL},
        /* issue 16: fp16 loss scaling, optimizer offload, sub-groups, the 16-bit save */
        {"{\"fp16\": {\"loss_scale\": -1}}",
         "ds.json: fp16.loss_scale: expected a number >= 0 (0: dynamic), got -1", NULL},
        {"{\"fp16\": {\"loss_scale\": \"dynamic\"}}", "fp16.loss_scale", "\"dynamic\""},
        {"{\"fp16\": {\"loss_scale\": 1e39}}", "fp16.loss_scale", NULL},
        {"{\"fp16\": {\"initial_scale_power\": 65}}",
         "ds.json: fp16.initial_scale_power: expected an integer 0..64, got 65", NULL},
        {"{\"fp16\": {\"initial_scale_power\": -1}}", "fp16.initial_scale_power", "got -1"},
        {"{\"fp16\": {\"initial_scale_power\": 15.5}}", "fp16.initial_scale_power", "got 15.5"},
        {"{\"fp16\": {\"initial_scale_power\": \"16\"}}", "fp16.initial_scale_power", "\"16\""},
        {"{\"fp16\": {\"loss_scale_window\": 0}}",
         "ds.json: fp16.loss_scale_window: expected a positive integer, got 0", NULL},
        {"{\"fp16\": {\"loss_scale_window\": [1000]}}", "fp16.loss_scale_window", "[1000]"},
        {"{\"fp16\": {\"hysteresis\": 0}}", "fp16.hysteresis: expected a positive integer", NULL},
        {"{\"fp16\": {\"hysteresis\": true}}", "fp16.hysteresis", "got true"},
        {"{\"fp16\": {\"consecutive_hysteresis\": 2}}",
         "fp16.consecutive_hysteresis: expected true or false", "got 2"},
        {"{\"fp16\": {\"consecutive_hysteresis\": \"yes\"}}", "fp16.consecutive_hysteresis",
         "\"yes\""},
        {"{\"fp16\": {\"min_loss_scale\": 0}}",
         "ds.json: fp16.min_loss_scale: expected a number > 0, got 0", NULL},
        {"{\"fp16\": {\"min_loss_scale\": -2}}", "fp16.min_loss_scale", "got -2"},
        {"{\"fp16\": {\"min_loss_scale\": {}}}", "fp16.min_loss_scale", "{}"},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"pin_memory\": \"yes\"}}}",
         "zero_optimization.offload_optimizer.pin_memory: expected true or false", "\"yes\""},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"pin_memory\": 3}}}",
         "zero_optimization.offload_optimizer.pin_memory", "got 3"},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"buffer_count\": 0}}}",
         "zero_optimization.offload_optimizer.buffer_count: expected a positive integer", "got 0"},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"buffer_count\": 2.5}}}",
         "zero_optimization.offload_optimizer.buffer_count", "got 2.5"},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"buffer_count\": \"4\"}}}",
         "zero_optimization.offload_optimizer.buffer_count", "\"4\""},
        {"{\"zero_optimization\": {\"sub_group_size\": 0}}",
         "ds.json: zero_optimization.sub_group_size: expected a positive integer, got 0", NULL},
        {"{\"zero_optimization\": {\"sub_group_size\": -1e9}}", "zero_optimization.sub_group_size",
         "got -1000000000"},
        {"{\"zero_optimization\": {\"sub_group_size\": 1.5e0}}",
         "zero_optimization.sub_group_size", "got 1.5"},
        {"{\"zero_optimization\": {\"sub_group_size\": \"1e9\"}}",
         "zero_optimization.sub_group_size", "\"1e9\""},
        {"{\"zero_optimization\": {\"stage3_gather_16bit_weights_on_model_save\": \"true\"}}",
         "zero_optimization.stage3_gather_16bit_weights_on_model_save: expected true or false",
         NULL},
        {"{\"zero_optimization\": {\"stage3_gather_fp16_weights_on_model_save\": 2}}",
         "zero_optimization.stage3_gather_fp16_weights_on_model_save: expected true or false",
         "got 2"},
        {"{\"zero_optimization\": {\"stage3_gather_16bit_weights_on_model_save\": true,"
         " \"stage3_gather_fp16_weights_on_model_save\": false}}",
         "ds.json: zero_optimization.stage3_gather_fp16_weights_on_model_save is false but "
         "zero_optimization.stage3_gather_16bit_weights_on_model_save is true", "give one"},
        {"{\"zero_optimization\": {\"stage3_gather_fp16_weights_on_model_save\": 0,"
         " \"stage3_gather_16bit_weights_on_model_save\": 1}}",
         "zero_optimization.stage3_gather_16bit_weights_on_model_save is true but "
         "zero_optimization.stage3_gather_fp16_weights_on_model_save is false", NULL},
        /* cross-field rules within one file */
        {"{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\"}}}",
         "ds.json: zero_optimization.offload_param.nvme_path", "nvme"},
        {"{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\","
         " \"nvme_path\": \"auto\"}}}",
         "zero_optimization.offload_param.nvme_path", NULL},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\"}}}",
         "zero_optimization.offload_optimizer.nvme_path", NULL},
        {"{\"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": \"cpu\"}}}",
         "zero_optimization.offload_param", "zero_optimization.stage 3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zs_zero_opts o;
        memset(&o, 0x5a, sizeof o);
        zs_zero_opts before = o;
        int rc = parse(cases[i].json, &o);
        CHECK(rc == ZS_EINVAL, "case %zu (%s): rc %d (%s)", i, cases[i].json, rc, zs_errmsg());
        if (cases[i].needle2) CHECK_ERR(rc, cases[i].needle1, cases[i].needle2);
        else CHECK_ERR(rc, cases[i].needle1);
        CHECK(memcmp(&o, &before, sizeof o) == 0, "case %zu: out written on failure", i);
    }

    /* Allowed edge values around those cases. */
    zs_zero_opts o;
    CHECK(parse("{\"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": \"none\"},"
                " \"offload_optimizer\": {\"device\": \"cpu\"}}}", &o) == 0,
          "stage 2 + optimizer offload: %s", zs_errmsg());
    CHECK(parse("{\"aio\": {\"block_size\": 4096, \"queue_depth\": 4096}}", &o) == 0 &&
              o.aio_block_size == 4096 && o.aio_queue_depth == 4096,
          "aio minimum: %s", zs_errmsg());
    CHECK(parse("{\"aio\": {\"block_size\": 67108864}}", &o) == 0, "aio max: %s", zs_errmsg());
    CHECK(parse("{\"zero_optimization\": {\"stage3_prefetch_bucket_size\": 0,"
                " \"stage3_param_persistence_threshold\": 0}}", &o) == 0 &&
              o.prefetch_bucket_size == 0 && o.param_persistence_threshold == 0,
          "zero thresholds: %s", zs_errmsg());
    CHECK(parse("{\"bf16\": {\"enabled\": true}, \"fp16\": {\"enabled\": false}}", &o) == 0,
          "bf16 only: %s", zs_errmsg());
    CHECK(parse("{\"optimizer\": {\"params\": {\"amsgrad\": false, \"adam_w_mode\": 1,"
                " \"betas\": [0, 0.999]}}}", &o) == 0 && o.beta1 == 0.0f,
          "supported flags: %s", zs_errmsg());
}

/* The issue-16 keys: valid values (edges included), "auto" / null, both spellings of the 16-bit
 * save, merge and the range check. */
static void test_new_keys(void) {
    zs_zero_opts o;
    int rc = parse("{\"fp16\": {\"enabled\": true, \"loss_scale\": 128.5, \"initial_scale_power\": 0,"
                   " \"loss_scale_window\": 1, \"hysteresis\": 1, \"consecutive_hysteresis\": true,"
                   " \"min_loss_scale\": 1e-4},"
                   " \"zero_optimization\": {\"sub_group_size\": 1,"
                   " \"stage3_gather_fp16_weights_on_model_save\": false,"
                   " \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/nv\","
                   " \"pin_memory\": false, \"buffer_count\": 1}}}",
                   &o);
    CHECK(rc == 0, "%s", zs_errmsg());
    CHECK(o.fp16 == 1 && o.loss_scale == 128.5f && o.initial_scale_power == 0 &&
              o.loss_scale_window == 1 && o.hysteresis == 1 && o.consecutive_hysteresis == 1 &&
              o.min_loss_scale == 1e-4f,
          "fp16 keys: %g %d %d %d %d %g", o.loss_scale, o.initial_scale_power,
          o.loss_scale_window, o.hysteresis, o.consecutive_hysteresis, o.min_loss_scale);
    CHECK(o.sub_group_size == 1 && o.gather_16bit_on_save == 0 && o.optimizer_pin_memory == 0 &&
              o.optimizer_buffer_count == 1 && o.offload_optimizer == ZS_OFFLOAD_NVME,
          "offload keys: %lld %d %d %d", (long long)o.sub_group_size, o.gather_16bit_on_save,
          o.optimizer_pin_memory, o.optimizer_buffer_count);
    rc = parse("{\"fp16\": {\"loss_scale\": 0, \"initial_scale_power\": 64,"
               " \"consecutive_hysteresis\": 0, \"loss_scale_window\": 1e3, \"hysteresis\": 2.0},"
               " \"zero_optimization\": {\"sub_group_size\": 1e9,"
               " \"stage3_gather_16bit_weights_on_model_save\": 1,"
               " \"stage3_gather_fp16_weights_on_model_save\": true,"
               " \"offload_optimizer\": {\"pin_memory\": 1, \"buffer_count\": 8}}}",
               &o);
    CHECK(rc == 0, "%s", zs_errmsg());
    CHECK(o.loss_scale == 0.0f && o.initial_scale_power == 64 && o.consecutive_hysteresis == 0 &&
              o.loss_scale_window == 1000 && o.hysteresis == 2 && o.sub_group_size == 1000000000 &&
              o.gather_16bit_on_save == 1 && o.optimizer_pin_memory == 1 &&
              o.optimizer_buffer_count == 8,
          "edges / reals / both spellings agreeing");
    /* "auto" / null mean unset, and an unset spelling never disagrees with the other one */
    rc = parse("{\"fp16\": {\"loss_scale\": \"auto\", \"initial_scale_power\": null,"
               " \"loss_scale_window\": \"auto\", \"hysteresis\": null,"
               " \"consecutive_hysteresis\": \"auto\", \"min_loss_scale\": \"auto\"},"
               " \"zero_optimization\": {\"sub_group_size\": \"auto\","
               " \"stage3_gather_16bit_weights_on_model_save\": \"auto\","
               " \"stage3_gather_fp16_weights_on_model_save\": true,"
               " \"offload_optimizer\": {\"pin_memory\": null, \"buffer_count\": \"auto\"}}}",
               &o);
    CHECK(rc == 0, "%s", zs_errmsg());
    CHECK(isnan(o.loss_scale) && o.initial_scale_power == -1 && o.loss_scale_window == 0 &&
              o.hysteresis == 0 && o.consecutive_hysteresis == -1 && isnan(o.min_loss_scale) &&
              o.sub_group_size == 0 && o.optimizer_pin_memory == -1 &&
              o.optimizer_buffer_count == 0 && o.gather_16bit_on_save == 1,
          "auto / null");
    rc = parse("{\"zero_optimization\": {\"stage3_gather_16bit_weights_on_model_save\": false,"
               " \"stage3_gather_fp16_weights_on_model_save\": null}}", &o);
    CHECK(rc == 0 && o.gather_16bit_on_save == 0, "16bit false + fp16 null: %s", zs_errmsg());

    /* merge: every new field, set values win, unset ones leave dst alone */
    zs_zero_opts a, b;
    zs_zero_opts_init(&a);
    zs_zero_opts_init(&b);
    a.loss_scale = 4;
    a.initial_scale_power = 8;
    a.loss_scale_window = 10;
    a.hysteresis = 3;
    a.consecutive_hysteresis = 0;
    a.min_loss_scale = 2;
    a.optimizer_pin_memory = 1;
    a.optimizer_buffer_count = 2;
    a.sub_group_size = 100;
    a.gather_16bit_on_save = 0;
    zs_zero_opts before = a;
    zs_zero_opts_merge(&a, &b);
    CHECK(memcmp(&a, &before, sizeof a) == 0, "merge of unset changed the new fields");
    b.loss_scale = 0; /* dynamic: a value, not unset */
    b.initial_scale_power = 0;
    b.loss_scale_window = 7;
    b.hysteresis = 1;
    b.consecutive_hysteresis = 1;
    b.min_loss_scale = 0.25f;
    b.optimizer_pin_memory = 0;
    b.optimizer_buffer_count = 6;
    b.sub_group_size = 5;
    b.gather_16bit_on_save = 1;
    zs_zero_opts_merge(&a, &b);
    CHECK(a.loss_scale == 0 && a.initial_scale_power == 0 && a.loss_scale_window == 7 &&
              a.hysteresis == 1 && a.consecutive_hysteresis == 1 && a.min_loss_scale == 0.25f &&
              a.optimizer_pin_memory == 0 && a.optimizer_buffer_count == 6 &&
              a.sub_group_size == 5 && a.gather_16bit_on_save == 1,
          "new fields merged");
    CHECK(zs_zero_opts_check(&a, NULL) == 0, "%s", zs_errmsg());
    a.initial_scale_power = 65;
    CHECK_ERR(zs_zero_opts_check(&a, "opts"), "opts", "out of range");
    a.initial_scale_power = 0;
    a.min_loss_scale = 0;
    CHECK_ERR(zs_zero_opts_check(&a, "opts"), "out of range");
    a.min_loss_scale = NAN;
    a.offload_optimizer = ZS_OFFLOAD_NVME; /* nvme without a path */
    CHECK_ERR(zs_zero_opts_check(&a, "opts"), "zero_optimization.offload_optimizer.nvme_path");
}

/* Every accepted-but-ignored key: reported exactly once with a non-empty "instead", whatever the
 * value (null, "auto", objects); absent ones are not reported; without a callback: the log. */
static void test_ignored(void) {
    static const char *keys[] = {
        "zero_optimization.overlap_comm", "zero_optimization.contiguous_gradients",
        "zero_optimization.reduce_bucket_size", "zero_optimization.reduce_scatter",
        "zero_optimization.allgather_partitions", "zero_optimization.allgather_bucket_size",
        "zero_optimization.round_robin_gradients", "zero_optimization.stage3_max_reuse_distance",
        "zero_optimization.ignore_unused_parameters", "zero_optimization.elastic_checkpoint",
        "zero_optimization.load_from_fp32_weights", "zero_optimization.offload_param.max_in_cpu",
        "zero_optimization.offload_optimizer.fast_init", "zero_optimization.offload_optimizer.pipeline",
        "zero_optimization.offload_optimizer.pipeline_read",
        "zero_optimization.offload_optimizer.pipeline_write",
        "zero_optimization.offload_optimizer.ratio", "aio.thread_count", "aio.single_submit",
        "aio.overlap_events", "aio.intra_op_parallelism", "aio.use_gds", "fp16.auto_cast",
        "optimizer.params.torch_adam", "scheduler.params.last_batch_iteration", "steps_per_print",
        "wall_clock_breakdown", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
        "gradient_predivide_factor", "prescale_gradients", "dump_state", "memory_breakdown",
        "activation_checkpointing", "flops_profiler", "tensorboard", "wandb", "csv_monitor",
        "comms_logger"};
    const int nk = (int)(sizeof keys / sizeof keys[0]);
    const char *all =
        "{\"zero_optimization\": {\"overlap_comm\": true, \"contiguous_gradients\": null,"
        "   \"reduce_bucket_size\": \"auto\", \"reduce_scatter\": \"nonsense\","
        "   \"allgather_partitions\": 7, \"allgather_bucket_size\": 5e8,"
        "   \"round_robin_gradients\": false, \"stage3_max_reuse_distance\": \"auto\","
        "   \"ignore_unused_parameters\": true, \"elastic_checkpoint\": [1],"
        "   \"load_from_fp32_weights\": {\"x\": 1},"
        "   \"offload_param\": {\"max_in_cpu\": null},"
        "   \"offload_optimizer\": {\"fast_init\": false, \"pipeline\": \"auto\","
        "     \"pipeline_read\": true, \"pipeline_write\": null, \"ratio\": 0.3}},"
        " \"aio\": {\"thread_count\": 4, \"single_submit\": null, \"overlap_events\": \"auto\","
        "   \"intra_op_parallelism\": 2, \"use_gds\": false},"
        " \"fp16\": {\"auto_cast\": \"auto\"},"
        " \"optimizer\": {\"params\": {\"torch_adam\": null}},"
        " \"scheduler\": {\"params\": {\"last_batch_iteration\": -1}},"
        " \"steps_per_print\": \"auto\", \"wall_clock_breakdown\": null,"
        " \"zero_allow_untested_optimizer\": true, \"zero_force_ds_cpu_optimizer\": false,"
        " \"gradient_predivide_factor\": 1.0, \"prescale_gradients\": false,"
        " \"dump_state\": null, \"memory_breakdown\": \"auto\","
        " \"activation_checkpointing\": {\"partition_activations\": true,"
        "   \"cpu_checkpointing\": true},"
        " \"flops_profiler\": {\"enabled\": false}, \"tensorboard\": null,"
        " \"wandb\": {\"enabled\": true, \"project\": \"p\"}, \"csv_monitor\": \"auto\","
        " \"comms_logger\": {\"enabled\": false}}";
    static reports r;
    zs_zero_opts o, ref;
    int rc = parse_r(all, &o, &r);
    CHECK(rc == 0, "%s", zs_errmsg());
    CHECK(r.u.n == 0, "%d unknown keys, first '%s'", r.u.n, r.u.keys[0]);
    CHECK(r.g.n == nk, "%d ignored reports, expected %d", r.g.n, nk);
    for (int i = 0; i < nk; i++) {
        int c = 0, at = find_ign(&r.g, keys[i], &c);
        CHECK(c == 1, "'%s' reported %d times", keys[i], c);
        if (at >= 0) {
            CHECK(strlen(r.g.instead[at]) >= 20, "'%s': instead text too short: '%s'", keys[i],
                  r.g.instead[at]);
            CHECK(strcmp(r.g.origin[at], "ds.json") == 0, "origin %s", r.g.origin[at]);
        }
    }
    /* nothing descended into an ignored key's value */
    CHECK(find_ign(&r.g, "activation_checkpointing.partition_activations", NULL) < 0,
          "descended into an ignored block");
    zs_zero_opts_init(&ref);
    CHECK(memcmp(&o, &ref, sizeof o) == 0, "ignored keys changed a field");
    /* texts promised by the issue, verbatim */
    static const struct { const char *key, *text; } promised[] = {
        {"zero_optimization.overlap_comm", "reduce-scattered as soon as its backward produces it"},
        {"activation_checkpointing", "zeroserve always recomputes each layer's activations in the "
                                     "backward (one checkpoint per layer)"},
        {"wandb", "no experiment tracker: progress goes to stdout, job events and /metrics"},
        {"fp16.auto_cast", "the CPU backend computes in fp32 and casts the gradients to fp16 for "
                           "the wire"},
        {"zero_optimization.reduce_bucket_size", "each bucket (one layer) is one reduction"},
    };
    for (size_t i = 0; i < sizeof promised / sizeof promised[0]; i++) {
        int at = find_ign(&r.g, promised[i].key, NULL);
        CHECK(at >= 0 && strstr(r.g.instead[at], promised[i].text), "'%s': '%s'", promised[i].key,
              at >= 0 ? r.g.instead[at] : "(absent)");
    }

    /* absent keys are not reported: only the two present ones */
    rc = parse_r("{\"zero_optimization\": {\"stage\": 3, \"overlap_comm\": false},"
                 " \"wandb\": null, \"bf16\": {\"enabled\": true}}", &o, &r);
    CHECK(rc == 0 && r.g.n == 2 && find_ign(&r.g, "zero_optimization.overlap_comm", NULL) == 0 &&
              find_ign(&r.g, "wandb", NULL) == 1 && r.u.n == 0,
          "rc %d: %d reports", rc, r.g.n);
    rc = parse_r("{\"zero_optimization\": {\"stage\": 3}, \"aio\": null}", &o, &r);
    CHECK(rc == 0 && r.g.n == 0, "%d reports for a file without ignored keys", r.g.n);
    /* a parse reports again (once per parse) */
    rc = parse_r("{\"wandb\": {}}", &o, &r);
    CHECK(rc == 0 && r.g.n == 1, "%d", r.g.n);

    /* the _ex functions report ignored keys to the log; unknown keys still go to on_unknown */
    unknowns u = {.n = 0};
    fprintf(stderr, "(one 'steps_per_print is accepted but not used' warning expected next)\n");
    rc = zs_dsconfig_parse_ex("{\"steps_per_print\": 1, \"bogus\": 1}", "ds.json", on_unknown, &u, &o);
    CHECK(rc == 0 && u.n == 1 && count_key(&u, "bogus") == 1, "rc %d n %d", rc, u.n);

    /* load_rep: the same through a file, origin = the path */
    char dir[512], path[600];
    CHECK(tu_tmpdir(dir, sizeof dir, "dsconfig") == 0, "tmpdir");
    snprintf(path, sizeof path, "%s/ds.json", dir);
    const char *t = "{\"dump_state\": true, \"zero_optimization\": {\"reduce_scatter\": true}}";
    CHECK(tu_write_file(path, t, strlen(t)) == 0, "write");
    memset(&r, 0, sizeof r);
    rc = zs_dsconfig_load_rep(path, rep_unknown, rep_ignored, &r, &o);
    CHECK(rc == 0 && r.g.n == 2 && strcmp(r.g.origin[0], path) == 0 &&
              strcmp(r.g.keys[0], "dump_state") == 0 &&
              strcmp(r.g.keys[1], "zero_optimization.reduce_scatter") == 0,
          "load_rep: rc %d n %d", rc, r.g.n);
    tu_rmdir(dir);
}

/* A file setting every field that zs_zero_opts_report_unused knows. */
static const char *every_field =
    "{\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 2,"
    " \"gradient_accumulation_steps\": 4, \"gradient_clipping\": 1.0,"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4, \"betas\": [0.9, 0.99],"
    "   \"eps\": 1e-8, \"weight_decay\": 0.01}},"
    " \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": 0,"
    "   \"warmup_max_lr\": 1e-4, \"warmup_num_steps\": 10, \"total_num_steps\": 100,"
    "   \"warmup_type\": \"linear\"}},"
    " \"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 12,"
    "   \"loss_scale_window\": 500, \"hysteresis\": 2, \"consecutive_hysteresis\": true,"
    "   \"min_loss_scale\": 0.5},"
    " \"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 1e6,"
    "   \"stage3_gather_16bit_weights_on_model_save\": true,"
    "   \"stage3_prefetch_bucket_size\": 5e7, \"stage3_max_live_parameters\": 1e9,"
    "   \"stage3_param_persistence_threshold\": 1e4,"
    "   \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/nv\", \"pin_memory\": true,"
    "     \"buffer_count\": 5, \"buffer_size\": 1e8},"
    "   \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/nv/opt\","
    "     \"pin_memory\": true, \"buffer_count\": 4}},"
    " \"aio\": {\"block_size\": 1048576, \"queue_depth\": 16}}";

/* The fields nothing uses: reported for every command. */
static const char *never_used[] = {"zero_optimization.offload_param.pin_memory",
                                   "zero_optimization.offload_param.buffer_size",
                                   "zero_optimization.stage3_prefetch_bucket_size"};
/* Used by `train` and a server's fine-tuning jobs. */
static const char *train_or_jobs[] = {
    "zero_optimization.offload_optimizer.device", "zero_optimization.offload_optimizer.nvme_path",
    "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_optimizer.buffer_count", "zero_optimization.sub_group_size",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save", "fp16.loss_scale",
    "fp16.initial_scale_power", "fp16.loss_scale_window", "fp16.hysteresis",
    "fp16.consecutive_hysteresis", "fp16.min_loss_scale"};
/* Used by `train` only. */
static const char *train_only[] = {
    "optimizer.type", "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps",
    "optimizer.params.weight_decay", "scheduler.type", "scheduler.params.warmup_type",
    "scheduler.params.warmup_num_steps", "scheduler.params.total_num_steps",
    "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr",
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "train_batch_size"};
#define NA(a) ((int)(sizeof a / sizeof a[0]))

/* Checks that each of keys[0..n) was reported exactly once with `text` in its instead. */
static void expect_reported(const ignoreds *g, const char *what, const char *const *keys, int n,
                            const char *text) {
    for (int i = 0; i < n; i++) {
        int c = 0, at = find_ign(g, keys[i], &c);
        CHECK(c == 1, "%s: '%s' reported %d times", what, keys[i], c);
        if (at >= 0 && text)
            CHECK(strstr(g->instead[at], text) != NULL, "%s: '%s': '%s' lacks '%s'", what, keys[i],
                  g->instead[at], text);
    }
}

static void test_report_unused(void) {
    zs_zero_opts o;
    int rc = parse(every_field, &o);
    CHECK(rc == 0, "%s", zs_errmsg());
    if (rc) return;
    static ignoreds g;
    const unsigned E = ZS_DS_USE_ENGINE, T = ZS_DS_USE_TRAIN, J = ZS_DS_USE_JOBS;

    /* train: everything is used but the three fields nothing uses, in table order */
    memset(&g, 0, sizeof g);
    zs_zero_opts_report_unused(&o, "ds.json", E | T, on_ignored, &g);
    CHECK(g.n == NA(never_used), "train: %d reports, expected %d (first '%s')", g.n, NA(never_used),
          g.keys[0]);
    for (int i = 0; i < NA(never_used) && i < g.n; i++)
        CHECK(strcmp(g.keys[i], never_used[i]) == 0 && strlen(g.instead[i]) >= 20 &&
                  strcmp(g.origin[i], "ds.json") == 0,
              "train report %d: '%s'", i, g.keys[i]);
    int at = find_ign(&g, "zero_optimization.stage3_prefetch_bucket_size", NULL);
    CHECK(at >= 0 && strstr(g.instead[at], "stage3_max_live_parameters"), "prefetch: %s",
          at >= 0 ? g.instead[at] : "");
    /* train + jobs changes nothing */
    memset(&g, 0, sizeof g);
    zs_zero_opts_report_unused(&o, "ds.json", E | T | J, on_ignored, &g);
    CHECK(g.n == NA(never_used), "train+jobs: %d", g.n);

    /* engine only (generate, bench, serve without jobs): nothing of the training is used */
    memset(&g, 0, sizeof g);
    zs_zero_opts_report_unused(&o, "ds.json", E, on_ignored, &g);
    CHECK(g.n == NA(never_used) + NA(train_or_jobs) + NA(train_only), "engine: %d reports", g.n);
    expect_reported(&g, "engine", never_used, NA(never_used), NULL);
    expect_reported(&g, "engine", train_or_jobs, NA(train_or_jobs), "this command does not train");
    expect_reported(&g, "engine", train_only, NA(train_only), "this command does not train");
    for (int i = 1; i < g.n && i < MAXREP; i++) /* the fixed order: zero_optimization first */
        CHECK(!(strncmp(g.keys[i - 1], "optimizer", 9) == 0 &&
                strncmp(g.keys[i], "zero_optimization", 17) == 0),
              "order: '%s' before '%s'", g.keys[i - 1], g.keys[i]);
    static const char *engine_keys[] = {
        "zero_optimization.stage", "zero_optimization.offload_param.device",
        "zero_optimization.offload_param.nvme_path", "zero_optimization.offload_param.buffer_count",
        "zero_optimization.stage3_max_live_parameters",
        "zero_optimization.stage3_param_persistence_threshold", "aio.block_size", "aio.queue_depth",
        "fp16.enabled"};
    for (int i = 0; i < NA(engine_keys); i++)
        CHECK(find_ign(&g, engine_keys[i], NULL) < 0, "engine: '%s' reported", engine_keys[i]);

    /* serve with fine-tuning jobs: loss scaling, optimizer offload, sub-groups and the 16-bit
     * save are used; the hyper-parameters come from each request */
    memset(&g, 0, sizeof g);
    zs_zero_opts_report_unused(&o, "ds.json", E | J, on_ignored, &g);
    CHECK(g.n == NA(never_used) + NA(train_only), "jobs: %d reports", g.n);
    expect_reported(&g, "jobs", never_used, NA(never_used), NULL);
    expect_reported(&g, "jobs", train_only, NA(train_only),
                    "fine-tuning jobs take their hyper-parameters from each request");
    for (int i = 0; i < NA(train_or_jobs); i++)
        CHECK(find_ign(&g, train_or_jobs[i], NULL) < 0, "jobs: '%s' reported", train_or_jobs[i]);

    /* fp16 off (false, or not given) with loss-scale keys: reported whatever the command */
    static const char *loss_keys[] = {"fp16.loss_scale", "fp16.initial_scale_power",
                                      "fp16.loss_scale_window", "fp16.hysteresis",
                                      "fp16.consecutive_hysteresis", "fp16.min_loss_scale"};
    for (int off = 0; off < 2; off++) {
        zs_zero_opts f = o;
        f.fp16 = off ? 0 : -1;
        for (int k = 0; k < 3; k++) {
            unsigned uses = k == 0 ? E | T : k == 1 ? E | J : E;
            memset(&g, 0, sizeof g);
            zs_zero_opts_report_unused(&f, "ds.json", uses, on_ignored, &g);
            expect_reported(&g, "fp16 off", loss_keys, NA(loss_keys), "fp16 is off: no loss scaling");
            if (k == 0) CHECK(g.n == NA(never_used) + NA(loss_keys), "fp16 off, train: %d", g.n);
        }
    }
    rc = parse("{\"bf16\": {\"enabled\": true}, \"fp16\": {\"loss_scale\": 1024,"
               " \"hysteresis\": 4}}", &o);
    CHECK(rc == 0, "%s", zs_errmsg());
    memset(&g, 0, sizeof g);
    zs_zero_opts_report_unused(&o, "ds.json", E | T, on_ignored, &g);
    CHECK(g.n == 2 && strcmp(g.keys[0], "fp16.loss_scale") == 0 &&
              strcmp(g.keys[1], "fp16.hysteresis") == 0 && strstr(g.instead[1], "fp16 is off"),
          "bf16 + loss scale: %d", g.n);

    /* offload_optimizer cpu (or not given) with the nvme-only keys */
    static const char *nvme_opt_keys[] = {"zero_optimization.offload_optimizer.pin_memory",
                                          "zero_optimization.offload_optimizer.buffer_count",
                                          "zero_optimization.sub_group_size"};
    const char *cpu_opt[] = {
        "{\"zero_optimization\": {\"sub_group_size\": 1e9, \"offload_optimizer\":"
        " {\"device\": \"cpu\", \"pin_memory\": true, \"buffer_count\": 4}}}",
        "{\"zero_optimization\": {\"sub_group_size\": 1e9, \"offload_optimizer\":"
        " {\"pin_memory\": false, \"buffer_count\": 4}}}"};
    for (int i = 0; i < 2; i++) {
        rc = parse(cpu_opt[i], &o);
        CHECK(rc == 0, "%s", zs_errmsg());
        for (int k = 0; k < 2; k++) {
            memset(&g, 0, sizeof g);
            zs_zero_opts_report_unused(&o, "ds.json", k ? E | J : E | T, on_ignored, &g);
            CHECK(g.n == NA(nvme_opt_keys), "optimizer cpu %d/%d: %d reports", i, k, g.n);
            expect_reported(&g, "optimizer cpu", nvme_opt_keys, NA(nvme_opt_keys),
                            "the optimizer state is in host memory (offload_optimizer.device is "
                            "not nvme)");
        }
    }
    /* ... and with nvme they are used */
    rc = parse("{\"zero_optimization\": {\"sub_group_size\": 1e9, \"offload_optimizer\":"
               " {\"device\": \"nvme\", \"nvme_path\": \"/x\", \"pin_memory\": true,"
               " \"buffer_count\": 4}}}", &o);
    CHECK(rc == 0, "%s", zs_errmsg());
    memset(&g, 0, sizeof g);
    zs_zero_opts_report_unused(&o, "ds.json", E | T, on_ignored, &g);
    CHECK(g.n == 0, "optimizer nvme: %d reports, first '%s'", g.n, g.keys[0]);

    /* parameters not on NVMe: the read-slot and aio keys drive nothing */
    rc = parse("{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"cpu\","
               " \"buffer_count\": 4, \"nvme_path\": \"/nv\"}}, \"aio\": {\"queue_depth\": 8,"
               " \"block_size\": 4096}}", &o);
    CHECK(rc == 0, "%s", zs_errmsg());
    memset(&g, 0, sizeof g);
    zs_zero_opts_report_unused(&o, "ds.json", E, on_ignored, &g);
    CHECK(g.n == 4 && strcmp(g.keys[0], "zero_optimization.offload_param.nvme_path") == 0 &&
              strcmp(g.keys[1], "zero_optimization.offload_param.buffer_count") == 0 &&
              strstr(g.instead[1], "offload_param.device is not nvme") &&
              strcmp(g.keys[2], "aio.block_size") == 0 && strcmp(g.keys[3], "aio.queue_depth") == 0 &&
              strstr(g.instead[3], "nothing is read from NVMe"),
          "param cpu: %d reports", g.n);
    /* aio with the optimizer state on NVMe is not reported (the optimizer may read through it) */
    o.offload_optimizer = ZS_OFFLOAD_NVME;
    snprintf(o.optimizer_nvme_path, sizeof o.optimizer_nvme_path, "/nv");
    memset(&g, 0, sizeof g);
    zs_zero_opts_report_unused(&o, "ds.json", E | T, on_ignored, &g);
    CHECK(g.n == 2 && find_ign(&g, "aio.queue_depth", NULL) < 0, "aio + optimizer nvme: %d", g.n);

    /* nothing set: nothing reported; no engine: the engine keys are reported */
    zs_zero_opts_init(&o);
    memset(&g, 0, sizeof g);
    zs_zero_opts_report_unused(&o, "ds.json", 0, on_ignored, &g);
    CHECK(g.n == 0, "unset: %d reports", g.n);
    o.zero_stage = 3;
    o.bf16 = 1;
    memset(&g, 0, sizeof g);
    zs_zero_opts_report_unused(&o, NULL, T, on_ignored, &g);
    CHECK(g.n == 2 && strcmp(g.keys[0], "zero_optimization.stage") == 0 &&
              strcmp(g.keys[1], "bf16.enabled") == 0 && strstr(g.instead[0], "engine") &&
              strcmp(g.origin[0], "options") == 0,
          "no engine: %d", g.n);
    /* without a callback: the log (one line expected) */
    fprintf(stderr, "(one 'zero_optimization.stage is accepted but not used' warning expected next)\n");
    o.bf16 = -1;
    zs_zero_opts_report_unused(&o, "ds.json", 0, NULL, NULL);
    zs_zero_opts_report_unused(NULL, "ds.json", E, on_ignored, &g); /* no-op */
}

static void test_unknown(void) {
    const char *text =
        "{\"wall_clock_breakdown\": false, \"steps_per_print\": 5,"
        " \"sparse_attention\": {\"mode\": \"fixed\"},"
        " \"zero_optimization\": {\"stage\": 3, \"overlap_comm\": true, \"overlap_foo\": 1,"
        "   \"offload_param\": {\"device\": \"cpu\", \"speed\": \"max\"}},"
        " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4, \"foo\": [1, 2]}},"
        " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"total_num_steps\": 10,"
        "   \"warmup_num_steps\": 5}},"
        " \"bf16\": {\"enabled\": true, \"immediate_grad_update\": false},"
        " \"amp\": {\"enabled\": false}}";
    static reports r;
    zs_zero_opts o;
    int rc = parse_r(text, &o, &r);
    unknowns u = r.u;
    CHECK(rc == 0, "%s", zs_errmsg());
    CHECK(r.g.n == 3 && strcmp(r.g.keys[0], "wall_clock_breakdown") == 0 &&
              strcmp(r.g.keys[1], "steps_per_print") == 0 &&
              strcmp(r.g.keys[2], "zero_optimization.overlap_comm") == 0,
          "%d ignored reports", r.g.n);
    static const char *expect[] = {
        "sparse_attention", "zero_optimization.overlap_foo",
        "zero_optimization.offload_param.speed",
        "optimizer.params.foo", "scheduler.params.total_num_steps", "bf16.immediate_grad_update",
        "amp"};
    int ne = (int)(sizeof expect / sizeof expect[0]);
    CHECK(u.n == ne, "%d unknown reports, expected %d", u.n, ne);
    for (int i = 0; i < ne; i++)
        CHECK(count_key(&u, expect[i]) == 1, "'%s' reported %d times", expect[i],
              count_key(&u, expect[i]));
    CHECK(count_key(&u, "sparse_attention.mode") == 0, "descended into an unknown block");
    CHECK(rc == 0 && o.zero_stage == 3 && o.offload_param == ZS_OFFLOAD_CPU && o.lr == 1e-4f &&
              o.warmup_steps == 5 && o.total_steps == -1 && o.bf16 == 1,
          "known values still parsed");

    /* Without a callback the reports go to the log, and parsing succeeds. */
    fprintf(stderr, "(two 'ignoring unknown key' warnings expected next)\n");
    rc = zs_dsconfig_parse("{\"zero_optimization\": {\"overlap_foo\": 1}, \"bar\": 2}", "ds.json",
                           &o);
    CHECK(rc == 0, "%s", zs_errmsg());

    /* Scheduler params filtered by type even when "params" comes before "type". */
    u.n = 0;
    rc = zs_dsconfig_parse_ex("{\"scheduler\": {\"params\": {\"warmup_max_lr\": 0.1,"
                              " \"cos_min_ratio\": 0.5}, \"type\": \"WarmupCosineLR\"}}",
                              "ds.json", on_unknown, &u, &o);
    CHECK(rc == 0 && u.n == 1 && count_key(&u, "scheduler.params.warmup_max_lr") == 1 &&
              isnan(o.warmup_max_lr) && o.cos_min_ratio == 0.5f,
          "rc %d n %d", rc, u.n);

    /* Duplicate keys are rejected, as DeepSpeed does. */
    rc = parse("{\"zero_optimization\": {\"stage\": 1, \"stage\": 3}}", &o);
    CHECK(rc == ZS_EFORMAT, "duplicate rc %d", rc);
    CHECK_ERR(rc, "ds.json", "duplicate", "line 1");
}

static void test_files_and_syntax(void) {
    zs_zero_opts o;
    memset(&o, 0x5a, sizeof o);
    zs_zero_opts before = o;

    int rc = parse("{\n  \"zero_optimization\": {\n    \"stage\": 3,\n  }\n}\n", &o);
    CHECK(rc == ZS_EFORMAT, "rc %d", rc);
    CHECK_ERR(rc, "ds.json", "not valid JSON", "line 4");
    rc = parse("", &o);
    CHECK_ERR(rc, "ds.json", "not valid JSON");
    rc = parse("[1, 2]", &o);
    CHECK(rc == ZS_EFORMAT, "rc %d", rc);
    CHECK_ERR(rc, "ds.json", "JSON object", "[1,2]");
    rc = parse("\"zero\"", &o);
    CHECK_ERR(rc, "ds.json", "JSON object");
    CHECK(memcmp(&o, &before, sizeof o) == 0, "out written on failure");

    char dir[512], path[600];
    CHECK(tu_tmpdir(dir, sizeof dir, "dsconfig") == 0, "tmpdir");
    snprintf(path, sizeof path, "%s/missing.json", dir);
    rc = zs_dsconfig_load(path, &o);
    CHECK(rc == ZS_ENOTFOUND, "missing rc %d", rc);
    CHECK_ERR(rc, "missing.json");

    rc = zs_dsconfig_load(dir, &o); /* a directory */
    CHECK_ERR(rc, dir);

    snprintf(path, sizeof path, "%s/bad.json", dir);
    const char *bad = "{\n\"zero_optimization\": {\"stage\": 3}\n\"aio\": {}\n}";
    CHECK(tu_write_file(path, bad, strlen(bad)) == 0, "write");
    rc = zs_dsconfig_load(path, &o);
    CHECK(rc == ZS_EFORMAT, "rc %d", rc);
    CHECK_ERR(rc, "bad.json", "line 3");

    snprintf(path, sizeof path, "%s/nul.json", dir);
    CHECK(tu_write_file(path, "{}\0{}", 5) == 0, "write");
    CHECK_ERR(zs_dsconfig_load(path, &o), "nul.json", "NUL");

    snprintf(path, sizeof path, "%s/ds.json", dir);
    const char *wrong = "{\"zero_optimization\": {\"stage\": \"three\"}}";
    CHECK(tu_write_file(path, wrong, strlen(wrong)) == 0, "write");
    CHECK_ERR(zs_dsconfig_load(path, &o), path, "zero_optimization.stage");

    /* Over 16 MiB: rejected before reading (a sparse file). */
    snprintf(path, sizeof path, "%s/huge.json", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "fopen");
    if (f) {
        CHECK(fseek(f, 16 * 1024 * 1024, SEEK_SET) == 0 && fputc(' ', f) == ' ', "grow");
        fclose(f);
        rc = zs_dsconfig_load(path, &o);
        CHECK(rc == ZS_EFORMAT, "huge rc %d", rc);
        CHECK_ERR(rc, "huge.json", "too large");
    }
    CHECK(memcmp(&o, &before, sizeof o) == 0, "out written on failure");
    tu_rmdir(dir);

    CHECK(zs_dsconfig_parse(NULL, "x", &o) == ZS_EINVAL, "NULL text");
    CHECK(zs_dsconfig_load(NULL, &o) == ZS_EINVAL, "NULL path");
}

static void test_offload_flag_and_batch(void) {
    int v = -7;
    CHECK(zs_offload_parse("nvme", &v) == 0 && v == ZS_OFFLOAD_NVME, "nvme");
    CHECK(zs_offload_parse("CPU", &v) == 0 && v == ZS_OFFLOAD_CPU, "CPU");
    CHECK(zs_offload_parse("none", &v) == 0 && v == ZS_OFFLOAD_NONE, "none");
    v = 42;
    CHECK_ERR(zs_offload_parse("gpu", &v), "\"gpu\"", "\"nvme\"");
    CHECK(v == 42, "out written on failure");
    CHECK_ERR(zs_offload_parse("", &v), "\"\"");
    CHECK(strcmp(zs_offload_name(ZS_OFFLOAD_NONE), "none") == 0 &&
              strcmp(zs_offload_name(ZS_OFFLOAD_CPU), "cpu") == 0 &&
              strcmp(zs_offload_name(ZS_OFFLOAD_NVME), "nvme") == 0 &&
              strcmp(zs_offload_name(-1), "unset") == 0 &&
              strcmp(zs_offload_name(9), "invalid") == 0,
          "names");

    zs_zero_opts o;
    zs_zero_opts_init(&o);
    int micro = 0, accum = 0;
    int64_t tb = 0;
    CHECK(zs_zero_opts_resolve_batch(&o, 4, &micro, &accum, &tb) == 0 && micro == 1 &&
              accum == 1 && tb == 4,
          "nothing set: %d %d %lld", micro, accum, (long long)tb);
    o.train_batch_size = 64;
    CHECK(zs_zero_opts_resolve_batch(&o, 4, &micro, &accum, &tb) == 0 && micro == 16 &&
              accum == 1 && tb == 64,
          "train only: %d %d", micro, accum);
    o.micro_batch = 4;
    CHECK(zs_zero_opts_resolve_batch(&o, 4, &micro, &accum, &tb) == 0 && micro == 4 &&
              accum == 4,
          "train+micro: %d %d", micro, accum);
    CHECK_ERR(zs_zero_opts_check_batch(&o, 3), "train_batch_size 64",
              "train_micro_batch_size_per_gpu 4");
    o.micro_batch = 0;
    o.grad_accum = 8;
    CHECK(zs_zero_opts_resolve_batch(&o, 2, &micro, &accum, &tb) == 0 && micro == 4 &&
              accum == 8,
          "train+accum: %d %d", micro, accum);
    o.micro_batch = 4;
    CHECK(zs_zero_opts_check_batch(&o, 2) == 0, "%s", zs_errmsg());
    micro = accum = -1;
    CHECK_ERR(zs_zero_opts_resolve_batch(&o, 1, &micro, &accum, NULL), "train_batch_size 64",
              "gradient_accumulation_steps 8", "world size 1");
    CHECK(micro == -1 && accum == -1, "out written on failure");
    o.train_batch_size = 0;
    CHECK(zs_zero_opts_resolve_batch(&o, 3, NULL, NULL, &tb) == 0 && tb == 96, "micro+accum");
    CHECK_ERR(zs_zero_opts_check_batch(&o, 0), "world size");
}

int main(void) {
    test_full();
    test_empty_and_auto();
    test_merge();
    test_bad_values();
    test_new_keys();
    test_ignored();
    test_report_unused();
    test_unknown();
    test_files_and_syntax();
    test_offload_flag_and_batch();
    return tu_finish("test-dsconfig");
}
