/* tls.c — the HTTPS certificate and key (tls.h): the files read with errors that name them, the PEM
 * text parsed by GnuTLS, and the key matched against the certificate, before libmicrohttpd (which
 * would only say that it could not start) gets them. */
#include "tls.h"

#include <errno.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common.h"

#define MAX_PEM (1u << 20) /* a certificate chain or key larger than this is not one */

int zs_tls_supported(void) { return MHD_is_feature_supported(MHD_FEATURE_TLS) == MHD_YES; }

/* The whole file as a NUL-terminated string, and its mode; flag names the option in messages. */
static int read_pem(const char *flag, const char *path, char **out, size_t *len, unsigned *mode) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return zs_err(ZS_ENOTFOUND, "%s %s: no such file", flag, path);
        return zs_err(ZS_EPERM, "%s %s: cannot open it (%s)", flag, path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return zs_err(ZS_EFORMAT, "%s %s: not a regular file", flag, path);
    }
    if (sb.st_size == 0 || (size_t)sb.st_size > MAX_PEM) {
        fclose(f);
        return zs_err(ZS_EFORMAT, "%s %s: %lld bytes, %s", flag, path, (long long)sb.st_size,
                      sb.st_size == 0 ? "an empty file" : "more than a PEM file of a certificate or key has (1 MiB at most)");
    }
    char *text = malloc((size_t)sb.st_size + 1);
    size_t n = text ? fread(text, 1, (size_t)sb.st_size, f) : 0;
    int err = ferror(f) || n != (size_t)sb.st_size;
    fclose(f);
    if (!text) return zs_err(ZS_ENOMEM, "out of memory");
    if (err) {
        free(text);
        return zs_err(ZS_EIO, "%s %s: read error", flag, path);
    }
    text[n] = '\0';
    if (memchr(text, '\0', n) && !strstr(text, "-----BEGIN ")) { /* binary: DER, most likely */
        free(text);
        return zs_err(ZS_EFORMAT, "%s %s: not PEM (a binary file; DER? convert it: openssl %s -inform der -in FILE -out FILE.pem)",
                      flag, path, !strcmp(flag, "--tls-cert") ? "x509" : "pkey");
    }
    *out = text;
    *len = n;
    *mode = (unsigned)sb.st_mode & 0777;
    return 0;
}

static void wipe_free(char *p, size_t n) {
    if (!p) return;
    volatile char *v = p;
    for (size_t i = 0; i < n; i++) v[i] = 0;
    free(p);
}

void zs_tls_free(zs_tls_pem *p) {
    if (!p) return;
    free(p->cert);
    wipe_free(p->key, p->key_len);
    memset(p, 0, sizeof *p);
}

/* The PEM markers each file must (and must not) have, with hints for the usual mistakes. */
static int check_markers(const char *cert_path, const char *cert, const char *key_path, const char *key) {
    if (!strstr(cert, "-----BEGIN CERTIFICATE-----")) {
        if (strstr(cert, "PRIVATE KEY-----"))
            return zs_err(ZS_EFORMAT, "--tls-cert %s: holds a private key, not a certificate (--tls-cert and --tls-key "
                          "swapped?)", cert_path);
        return zs_err(ZS_EFORMAT, "--tls-cert %s: not a PEM certificate (no -----BEGIN CERTIFICATE----- line)", cert_path);
    }
    if (strstr(key, "-----BEGIN ENCRYPTED PRIVATE KEY-----") || strstr(key, "Proc-Type: 4,ENCRYPTED"))
        return zs_err(ZS_EFORMAT, "--tls-key %s: the key is encrypted; give it unencrypted (openssl pkey -in %s -out "
                      "FILE, then chmod 600 FILE)", key_path, key_path);
    if (!strstr(key, "PRIVATE KEY-----")) {
        if (strstr(key, "-----BEGIN CERTIFICATE-----"))
            return zs_err(ZS_EFORMAT, "--tls-key %s: holds a certificate, not a private key (--tls-cert and --tls-key "
                          "swapped?)", key_path);
        return zs_err(ZS_EFORMAT, "--tls-key %s: not a PEM private key (no -----BEGIN ... PRIVATE KEY----- line)", key_path);
    }
    return 0;
}

/* GnuTLS parses both; the key must be the first certificate's. */
static int check_pair(const char *cert_path, const zs_tls_pem *p, const char *key_path) {
    gnutls_datum_t cd = {(unsigned char *)p->cert, (unsigned)p->cert_len};
    gnutls_datum_t kd = {(unsigned char *)p->key, (unsigned)p->key_len};
    gnutls_x509_crt_t *crts = NULL;
    unsigned ncrt = 0;
    int g = gnutls_x509_crt_list_import2(&crts, &ncrt, &cd, GNUTLS_X509_FMT_PEM, 0);
    if (g < 0 || ncrt == 0)
        return zs_err(ZS_EFORMAT, "--tls-cert %s: not a certificate GnuTLS can read (%s)", cert_path,
                      g < 0 ? gnutls_strerror(g) : "no certificate");
    time_t now = time(NULL), nb = gnutls_x509_crt_get_activation_time(crts[0]),
           na = gnutls_x509_crt_get_expiration_time(crts[0]);
    char when[32] = "";
    struct tm tm;
    if (na != (time_t)-1 && na < now && gmtime_r(&na, &tm)) {
        strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &tm);
        zs_log_warn("--tls-cert %s: the certificate expired on %s; clients will refuse it", cert_path, when);
    } else if (nb != (time_t)-1 && nb > now && gmtime_r(&nb, &tm)) {
        strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &tm);
        zs_log_warn("--tls-cert %s: the certificate is not valid before %s; clients will refuse it", cert_path, when);
    }
    for (unsigned i = 0; i < ncrt; i++) gnutls_x509_crt_deinit(crts[i]);
    gnutls_free(crts);

    gnutls_x509_privkey_t pk;
    if (gnutls_x509_privkey_init(&pk) < 0) return zs_err(ZS_ENOMEM, "out of memory");
    g = gnutls_x509_privkey_import2(pk, &kd, GNUTLS_X509_FMT_PEM, NULL, 0);
    gnutls_x509_privkey_deinit(pk);
    if (g < 0)
        return zs_err(ZS_EFORMAT, "--tls-key %s: not a private key GnuTLS can read (%s)", key_path, gnutls_strerror(g));

    gnutls_certificate_credentials_t cred;
    if (gnutls_certificate_allocate_credentials(&cred) < 0) return zs_err(ZS_ENOMEM, "out of memory");
    g = gnutls_certificate_set_x509_key_mem2(cred, &cd, &kd, GNUTLS_X509_FMT_PEM, NULL, 0);
    gnutls_certificate_free_credentials(cred);
    if (g == GNUTLS_E_CERTIFICATE_KEY_MISMATCH)
        return zs_err(ZS_EFORMAT, "--tls-key %s is not the key of the certificate in --tls-cert %s", key_path, cert_path);
    if (g < 0)
        return zs_err(ZS_EFORMAT, "--tls-cert %s with --tls-key %s: GnuTLS refuses the pair (%s)", cert_path, key_path,
                      gnutls_strerror(g));
    return 0;
}

int zs_tls_load(const char *cert_path, const char *key_path, zs_tls_pem *out) {
    if (!cert_path || !*cert_path || !key_path || !*key_path)
        return zs_err(ZS_EINVAL, "--tls-cert and --tls-key go together: give both files, or neither (plain HTTP)");
    zs_tls_pem p = {0};
    unsigned cmode = 0, kmode = 0;
    int rc = read_pem("--tls-cert", cert_path, &p.cert, &p.cert_len, &cmode);
    if (rc == 0) rc = read_pem("--tls-key", key_path, &p.key, &p.key_len, &kmode);
    if (rc == 0) rc = check_markers(cert_path, p.cert, key_path, p.key);
    if (rc == 0) rc = check_pair(cert_path, &p, key_path);
    if (rc < 0) {
        zs_tls_free(&p);
        return rc;
    }
    if (kmode & 077)
        zs_log_warn("--tls-key %s: others may read it (mode %03o); chmod 600 keeps the key to this user", key_path, kmode);
    *out = p;
    return 0;
}
