/* kvtier.h — where KV cache blocks go when they leave the cache's memory (--kv-offload): host
 * memory (cpu) or a file on NVMe (nvme). A tier holds fixed-size records (one KV block of every
 * layer, engine/model/kvswap.h), each put with a tag (the caller's key, e.g. a prefix hash) as a
 * list of pieces and read back into one, bit for bit; each record's XXH64 is checked on every
 * read, so a damaged record never comes back as KV.
 *
 * On NVMe a record is a 64-byte header (magic, tag, the payload's XXH64, the header's own XXH64)
 * and the payload, at 4096-aligned offsets, written and read with O_DIRECT where the filesystem
 * allows it (else through the page cache). The file grows as records are put; a full disk
 * (ENOSPC, or EFBIG under a file size limit) fails the put with ZS_ENOSPC and the tier stays
 * usable for the records it has.
 * - zs_kvtier_open: one unlinked file in dir (O_TMPFILE, else created and removed at once):
 *   nothing is left behind, even after kill -9 (sequences swapped out of a full cache).
 * - zs_kvtier_open_persistent: the named file dir/name, which outlives the process (the prefix
 *   cache's tier): a file header holds the record size and the caller's key (a hash of what
 *   decides the K/V values: the model, its dtypes). Opened again with the same key, every record
 *   whose header is whole is back (a write torn by kill -9 either left no whole header, or its
 *   payload fails its checksum when read: ZS_ECHECKSUM, and the caller drops it); with another
 *   key or a damaged file header the file starts over empty (the log says why). The file is
 *   locked (flock) while open: a second process gets ZS_EBUSY.
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

/* kind: ZS_KVTIER_CPU or ZS_KVTIER_NVME; dir: an existing writable directory for nvme (ignored
 * for cpu); rec_bytes: the bytes of every record (> 0). The errors name dir. */
int  zs_kvtier_open(int kind, const char *dir, size_t rec_bytes, zs_kvtier **out);
/* The named NVMe file dir/name (see above); key must not be 0. */
int  zs_kvtier_open_persistent(const char *dir, const char *name, size_t rec_bytes, uint64_t key, zs_kvtier **out);
void zs_kvtier_free(zs_kvtier *t);
int  zs_kvtier_kind(const zs_kvtier *t);
size_t zs_kvtier_rec_bytes(const zs_kvtier *t);

/* Stores one record gathered from iov[0..n) (their lengths add up to rec_bytes; else
 * ZS_EINVAL) under tag in a free slot, *slot. ZS_ENOSPC when the disk (or memory: ZS_ENOMEM) is
 * full, ZS_EIO on other write errors; nothing is kept then. */
int  zs_kvtier_put(zs_kvtier *t, const struct iovec *iov, int n, uint64_t tag, int *slot);
/* Reads record slot back, scattered into iov[0..n) (lengths as for put). ZS_ECHECKSUM when it
 * does not match what was put, ZS_EIO on a read error, ZS_EINVAL for a slot not in use. */
int  zs_kvtier_get(zs_kvtier *t, int slot, const struct iovec *iov, int n);
/* Frees a slot (a slot not in use is ignored); in a persistent file its header is cleared, so it
 * does not come back at the next open. */
void zs_kvtier_drop(zs_kvtier *t, int slot);
/* Slots there are (in use or not: 0..n-1), and the tag of one in use (1; 0 when not in use):
 * the records a persistent file brought back are found this way. */
int  zs_kvtier_slots(const zs_kvtier *t);
int  zs_kvtier_tag(const zs_kvtier *t, int slot, uint64_t *tag);

typedef struct {
    uint64_t puts, gets;         /* records written and read */
    uint64_t bytes_out, bytes_in; /* their bytes */
    uint64_t put_errors;         /* puts that failed (a full disk) */
    int slots_used;              /* records held now */
    int restored;                /* records a persistent file brought back at open */
    double put_s, get_s;         /* seconds spent writing and reading */
} zs_kvtier_stats;
void zs_kvtier_stats_get(const zs_kvtier *t, zs_kvtier_stats *out);

#endif
