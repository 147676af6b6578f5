/* test-dsconfig.c — DeepSpeed-style config parsing (engine/dsconfig.c): a realistic ZeRO-3 +
 * NVMe file, "auto" and 5e8 values, merge semantics, every wrong-type / impossible-value case
 * (the message must name the full dotted key), unknown keys reported once each, file errors,
 * the --offload flag parser and the batch-size rule. */
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

/* Parses text as "ds.json" (unknown keys collected, not logged). */
static int parse(const char *text, zs_zero_opts *o) {
    unknowns u = {.n = 0};
    return zs_dsconfig_parse_ex(text, "ds.json", on_unknown, &u, o);
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
    unknowns u = {.n = 0};
    int rc = zs_dsconfig_parse_ex(full_config, "ds.json", on_unknown, &u, &o);
    CHECK(rc == 0, "rc %d: %s", rc, zs_errmsg());
    if (rc) return;
    CHECK(u.n == 0, "%d unknown keys reported, first '%s'", u.n, u.keys[0]);
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
    rc = zs_dsconfig_load(path, &f);
    CHECK(rc == 0, "rc %d: %s", rc, zs_errmsg());
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
    unknowns u = {.n = 0};
    zs_zero_opts o;
    int rc = zs_dsconfig_parse_ex(text, "ds.json", on_unknown, &u, &o);
    CHECK(rc == 0, "%s", zs_errmsg());
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
    test_unknown();
    test_files_and_syntax();
    test_offload_flag_and_batch();
    return tu_finish("test-dsconfig");
}
