/* fileio.h — small file-system helpers shared by the shard store and the checkpoints: errno to
 * ZS_E* codes, malloc'd printf, directory fsync, full positional writes. Thread-safe. */
#ifndef ZS_FILEIO_H
#define ZS_FILEIO_H

#include <stddef.h>
#include <sys/types.h>

/* ENOENT/ENOTDIR -> ZS_ENOTFOUND, EACCES/EPERM/EROFS -> ZS_EPERM, ENOSPC/EDQUOT -> ZS_ENOSPC,
 * ENOMEM -> ZS_ENOMEM, anything else ZS_EIO. */
int zs_errno_code(int e);
/* vasprintf into a new string (NULL when out of memory). */
char *zs_str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* fsync a directory so that renames and unlinks in it are durable; filesystems that cannot fsync
 * a directory (EINVAL, EROFS) are tolerated. 0 or ZS_E* with a message. */
int zs_fsync_dir(const char *dir);
/* Writes n bytes at off, retrying short writes and EINTR. 0 or -errno (not a ZS_E* code). */
int zs_pwrite_all(int fd, const void *buf, size_t n, off_t off);

/* Writes a whole file atomically: path.tmp, fsync, rename over path, fsync of the directory; on
 * failure path is untouched and no temporary is left. 0 or ZS_E* with a message naming the file. */
int zs_write_file_atomic(const char *path, const void *data, size_t n);

/* mkdir -p (0755). 0 or ZS_E* with a message naming the directory. */
int zs_mkdir_p(const char *path);

#endif
