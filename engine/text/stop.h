/* stop.h — stop strings over streamed text: holds back text that could still become a stop
 * string, releases the rest, and cuts the output where the first stop string completes.
 *
 * Matching is on bytes. "First" means the stop string whose last byte arrives earliest in the
 * text (what a streaming client sees first); among stop strings that complete at the same
 * byte, the one starting earliest (the longest) wins. The result never depends on how the
 * text was split across pushes.
 *
 * UTF-8: input is expected to be complete UTF-8 characters; released text never ends inside
 * a character (the held-back part is extended backwards to a character boundary if needed).
 *
 * Ownership and threads: a zs_stop owns copies of its stop strings and the held-back text. One
 * zs_stop belongs to one sequence and must not be used by two threads at once. */
#ifndef ZS_STOP_H
#define ZS_STOP_H

#include <stddef.h>

#define ZS_STOP_MAX_COUNT 16 /* stop strings per request (OpenAI allows 4) */
#define ZS_STOP_MAX_LEN 256  /* bytes per stop string */

typedef struct zs_stop zs_stop;

/* n stop strings (0 <= n <= 16), each 1..256 bytes, NUL-terminated; they are copied. stops may
 * be NULL when n == 0 (then every push passes its text straight through). Bad arguments ->
 * ZS_EINVAL with a message naming "stop". */
int zs_stop_new(const char *const *stops, int n, zs_stop **out);
void zs_stop_free(zs_stop *s); /* NULL is fine */

/* Feeds len bytes of newly decoded text (text may be NULL when len == 0). Writes into out (cap
 * bytes, may be NULL when cap == 0) the text now safe to emit: everything except a suffix that
 * could still be the beginning of a stop string. *stopped = 1 when a stop string completed:
 * out then holds the text up to (not including) the stop string, and everything after it is
 * discarded; later pushes and flushes emit nothing and keep reporting *stopped = 1.
 * The output never exceeds zs_stop_held(s) + len bytes; if cap is smaller than what is to be
 * emitted, returns ZS_ENOSPC and leaves the state unchanged (nothing consumed). */
int zs_stop_push(zs_stop *s, const char *text, size_t len, char *out, size_t cap,
                 size_t *n_out, int *stopped);

/* End of generation without a stop: writes the held-back text (at most zs_stop_held(s) bytes)
 * and empties it. ZS_ENOSPC (state unchanged) when cap is too small. */
int zs_stop_flush(zs_stop *s, char *out, size_t cap, size_t *n_out);

/* Bytes currently held back (< 256 + 3). */
size_t zs_stop_held(const zs_stop *s);

#endif
