/* kvtier.h — where KV cache blocks go when they leave the cache's memory (--kv-offload): host
 * memory (cpu) or a file on NVMe (nvme). A tier holds fixed-size records (one KV block of every
 * layer, engine/model/kvswap.h), each put as a list of pieces and read back into one, bit for
 * bit; each record's XXH64 is kept in memory and checked on every read, so a damaged file never
 * comes back as KV.
 *
 * The NVMe tier is one unlinked file per tier under dir (O_TMPFILE, else created and removed at
 * once: nothing is left behind, even after kill -9), at 4096-aligned record offsets, written and
 * read with O_DIRECT where the filesystem allows it (else through the page cache). It grows as
 * records are put; a full disk (ENOSPC, or EFBIG under a file size limit) fails the put with
 * ZS_ENOSPC and the tier stays usable for the records it has.
 *
 * Ownership: the tier owns its records and file. Thread-safety: none; one thread (the engine
 * thread) uses a tier. Different tiers may be used from different threads. */
#ifndef ZS_KVTIER_H
#define ZS_KVTIER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

typedef struct zs_kvtier zs_kvtier;

/* Where the records live (the values of dsconfig.h's ZS_OFFLOAD_CPU and ZS_OFFLOAD_NVME). */
enum { ZS_KVTIER_CPU = 1, ZS_KVTIER_NVME = 2 };

/* kind: ZS_KVTIER_CPU or ZS_KVTIER_NVME; dir: an existing writable directory for
 * nvme (ignored for cpu); rec_bytes: the bytes of every record (> 0). The errors name dir. */
int  zs_kvtier_open(int kind, const char *dir, size_t rec_bytes, zs_kvtier **out);
void zs_kvtier_free(zs_kvtier *t);
int  zs_kvtier_kind(const zs_kvtier *t);
size_t zs_kvtier_rec_bytes(const zs_kvtier *t);

/* Stores one record gathered from iov[0..n) (their lengths add up to rec_bytes; else
 * ZS_EINVAL) in a free slot, *slot. ZS_ENOSPC when the disk (or memory: ZS_ENOMEM) is full,
 * ZS_EIO on other write errors; nothing is kept then. */
int  zs_kvtier_put(zs_kvtier *t, const struct iovec *iov, int n, int *slot);
/* Reads record slot back, scattered into iov[0..n) (lengths as for put). ZS_ECHECKSUM when it
 * does not match what was put, ZS_EIO on a read error, ZS_EINVAL for a slot not in use. */
int  zs_kvtier_get(zs_kvtier *t, int slot, const struct iovec *iov, int n);
/* Frees a slot (a slot not in use is ignored). */
void zs_kvtier_drop(zs_kvtier *t, int slot);

typedef struct {
    uint64_t puts, gets;         /* records written and read */
    uint64_t bytes_out, bytes_in; /* their bytes */
    uint64_t put_errors;         /* puts that failed (a full disk) */
    int slots_used;              /* records held now */
    double put_s, get_s;         /* seconds spent writing and reading */
} zs_kvtier_stats;
void zs_kvtier_stats_get(const zs_kvtier *t, zs_kvtier_stats *out);

#endif
