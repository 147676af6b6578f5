/* tls.h — the HTTPS certificate and private key of the HTTP layer (--tls-cert, --tls-key): both
 * PEM files read into memory and checked with GnuTLS before libmicrohttpd gets them, so that a
 * bad pair fails the start with a message naming the file and what is wrong with it.
 *
 * Ownership: zs_tls_load fills a zs_tls_pem whose strings the caller frees with zs_tls_free (the
 * key's bytes are wiped). Thread-safety: no shared state; any thread. */
#ifndef ZS_TLS_H
#define ZS_TLS_H

#include <stddef.h>

typedef struct {
    char *cert, *key; /* NUL-terminated PEM text */
    size_t cert_len, key_len;
} zs_tls_pem;

/* 1 when this libmicrohttpd can serve HTTPS (built with GnuTLS), else 0. */
int zs_tls_supported(void);

/* Reads and checks the pair: each file exists, is readable, a regular file under 1 MiB, holds PEM
 * (the certificate file a CERTIFICATE, the key file an unencrypted PRIVATE KEY) that GnuTLS parses,
 * and the key is the certificate's. Errors: ZS_ENOTFOUND (missing file), ZS_EPERM (cannot read
 * it), ZS_EFORMAT (not PEM, does not parse, encrypted key, key not the certificate's), ZS_ENOMEM;
 * messages name the flag and the file. A certificate that has expired or is not valid yet is only
 * a warning. *out is set only on success. */
int zs_tls_load(const char *cert_path, const char *key_path, zs_tls_pem *out);
void zs_tls_free(zs_tls_pem *p);

#endif
