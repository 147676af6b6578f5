/* plan-machines.c — the named machines of `zeroserve plan --machine NAME`: a GPU's published
 * memory, memory bandwidth and dense FP16 tensor FLOP/s (counted at ZS_PLAN_HBM_SHARE and
 * ZS_PLAN_FLOPS_SHARE of the datasheet, plan.h), its PCIe generation's practical host-to-device
 * rate, and the host it is assumed to sit in. Plain data. */
#include <ctype.h>
#include <string.h>

#include "common.h"
#include "plan.h"

/* Practical host-to-device copy rates of pinned memory over x16 links: about 80 % of the raw
 * 15.75 (Gen3), 31.5 (Gen4) and 63 (Gen5) GB/s per direction, as cudaMemcpy bandwidth tests
 * report. */
#define PCIE3_GBPS 12.0
#define PCIE4_GBPS 25.0
#define PCIE5_GBPS 50.0

/* The typical host assumed where the source of a published figure names none: 256 GB of DRAM
 * read at 100 GB/s (STREAM on an 8-channel DDR4-3200 server reaches about this; a 2-channel
 * desktop about 60), 2 TFLOP/s of f32 on its cores (about a 32-core AVX-512 part at 40 % of peak),
 * a 4 TB NVMe drive read at 3 GB/s and written at 2 GB/s (a PCIe Gen3/Gen4 data-center drive under
 * O_DIRECT). */
#define HOST_MEM 256e9
#define HOST_GBPS 100.0
#define HOST_FLOPS 2e12
#define NVME_BYTES 4e12
#define NVME_READ 3.0
#define NVME_WRITE 2.0

#define DEV(mem_gb, bw_gbps, tflops) (mem_gb) * 1e9, (bw_gbps) * ZS_PLAN_HBM_SHARE, (tflops) * 1e12 * ZS_PLAN_FLOPS_SHARE

typedef struct {
    const char *name;
    double dev_mem, hbm_gbps, dev_flops, pcie_gbps;
    double host_mem, host_gbps, host_flops, nvme, nvme_read, nvme_write;
} row;

static const row machines[] = {
    /* NVIDIA H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s, FP16 Tensor Core 1,979 TFLOPS with
     * sparsity (989 dense); PCIe Gen5 x16 to the host. */
    {"H200", DEV(141, 4800, 989), PCIE5_GBPS, HOST_MEM, HOST_GBPS, HOST_FLOPS, NVME_BYTES, NVME_READ, NVME_WRITE},
    /* NVIDIA A100 80GB SXM datasheet: 80 GB HBM2e, 2,039 GB/s, FP16 Tensor Core 312 TFLOPS
     * (624 with sparsity); PCIe Gen4 x16. */
    {"A100-80G", DEV(80, 2039, 312), PCIE4_GBPS, HOST_MEM, HOST_GBPS, HOST_FLOPS, NVME_BYTES, NVME_READ, NVME_WRITE},
    /* NVIDIA L40 datasheet: 48 GB GDDR6, 864 GB/s, FP16 Tensor 181 TFLOPS (362 with sparsity);
     * PCIe Gen4 x16. */
    {"L40", DEV(48, 864, 181), PCIE4_GBPS, HOST_MEM, HOST_GBPS, HOST_FLOPS, NVME_BYTES, NVME_READ, NVME_WRITE},
    /* NVIDIA Ada GPU architecture whitepaper, GeForce RTX 4090: 24 GB GDDR6X, 1,008 GB/s, FP16
     * Tensor with FP32 accumulate 165.2 TFLOPS dense (330.3 with FP16 accumulate); PCIe Gen4 x16. */
    {"RTX4090", DEV(24, 1008, 165.2), PCIE4_GBPS, HOST_MEM, HOST_GBPS, HOST_FLOPS, NVME_BYTES, NVME_READ, NVME_WRITE},
    /* NVIDIA RTX A6000 datasheet: 48 GB GDDR6, 768 GB/s, FP16 Tensor 154.8 TFLOPS dense (309.7
     * with sparsity); PCIe Gen4 x16. Host: ZeRO-Inference's benchmark workstation (DeepSpeedExamples
     * inference/huggingface/zero_inference/README.md): 252 GB of DRAM and a PNY CS3040 2 TB NVMe,
     * 5,600 MB/s sequential reads (4,300 MB/s writes, the drive's datasheet). */
    {"A6000", DEV(48, 768, 154.8), PCIE4_GBPS, 252e9, HOST_GBPS, HOST_FLOPS, 2e12, 5.6, 4.3},
    /* NVIDIA T4 datasheet: 16 GB GDDR6, 320 GB/s, 65 TFLOPS mixed-precision FP16/FP32; PCIe Gen3
     * x16. Host: FlexGen's GCP instance (Sheng et al., ICML 2023, and its README): 208 GB of DRAM,
     * a 1.5 TB SSD read at about 2 GB/s and written at about 1 GB/s. */
    {"T4", DEV(16, 320, 65), PCIE3_GBPS, 208e9, HOST_GBPS, HOST_FLOPS, 1.5e12, 2.0, 1.0},
};
#define N_MACHINES ((int)(sizeof machines / sizeof machines[0]))

static void build(int i, zs_plan_machine *m) {
    const row *r = &machines[i];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", r->name);
    m->devices = 1;
    m->dev_mem = r->dev_mem;
    m->hbm_gbps = r->hbm_gbps;
    m->dev_flops = r->dev_flops;
    m->pcie_gbps = r->pcie_gbps;
    m->host_mem = r->host_mem;
    m->host_gbps = r->host_gbps;
    m->host_flops = r->host_flops;
    m->nvme = r->nvme;
    m->nvme_read_gbps = r->nvme_read;
    m->nvme_write_gbps = r->nvme_write;
}

int zs_plan_machine_count(void) { return N_MACHINES; }

int zs_plan_machine_at(int i, zs_plan_machine *out) {
    if (i < 0 || i >= N_MACHINES) return zs_err(ZS_ERANGE, "plan: machine %d of %d", i, N_MACHINES);
    build(i, out);
    return 0;
}

/* Lower case without '-', '_' and ' ' ("RTX 4090" = "rtx-4090" = "RTX4090"). */
static void squash(const char *s, char *d, size_t n) {
    size_t k = 0;
    for (; *s && k + 1 < n; s++)
        if (*s != '-' && *s != '_' && *s != ' ') d[k++] = (char)tolower((unsigned char)*s);
    d[k] = 0;
}

int zs_plan_machine_find(const char *name, zs_plan_machine *out) {
    char want[64], have[64], names[256] = "";
    squash(name ? name : "", want, sizeof want);
    for (int i = 0; i < N_MACHINES; i++) {
        squash(machines[i].name, have, sizeof have);
        if (want[0] && !strcmp(want, have)) {
            build(i, out);
            return 0;
        }
        size_t k = strlen(names);
        snprintf(names + k, sizeof names - k, "%s%s", i ? ", " : "", machines[i].name);
    }
    return zs_err(ZS_ENOTFOUND, "--machine: unknown machine '%s' (known: %s, local)", name ? name : "", names);
}
