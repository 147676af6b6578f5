#!/bin/sh
# tests/tls/make-certs.sh — makes the test CA and the server certificate that tests/e2e-tls.sh
# serves (not run by make test; the files are committed). ECDSA P-256 keys (PKCS#8, unencrypted);
# both certificates valid from 2024-01-01 to 2049-12-31 (fixed dates, so a machine whose clock
# is behind or ahead by years still accepts them); the server's names 127.0.0.1, ::1 and
# localhost. For tests only: the keys are public.
#     sh tests/tls/make-certs.sh        (writes ca.pem, ca-key.pem, server.pem, server-key.pem here)
# Needs openssl (`openssl ca`, which takes explicit start and end dates).
set -eu
cd "$(dirname "$0")"
START=20240101000000Z
END=20491231235959Z
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
touch "$tmp/index.txt"
echo 1000 >"$tmp/serial"
cat >"$tmp/ca.cnf" <<CNF
[ca]
default_ca = test_ca
[test_ca]
database = $tmp/index.txt
serial = $tmp/serial
new_certs_dir = $tmp
default_md = sha256
policy = any
unique_subject = no
copy_extensions = none
[any]
organizationName = supplied
commonName = supplied
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[v3_server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,IP:::1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
CNF
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
key ca-key.pem
openssl req -new -key ca-key.pem -subj "/O=zeroserve tests/CN=zeroserve test CA" -out "$tmp/ca.csr"
openssl ca -batch -config "$tmp/ca.cnf" -selfsign -keyfile ca-key.pem -in "$tmp/ca.csr" -startdate $START \
    -enddate $END -extensions v3_ca -notext -out ca.pem 2>"$tmp/log" || { cat "$tmp/log"; exit 1; }
key server-key.pem
openssl req -new -key server-key.pem -subj "/O=zeroserve tests/CN=localhost" -out "$tmp/server.csr"
openssl ca -batch -config "$tmp/ca.cnf" -cert ca.pem -keyfile ca-key.pem -in "$tmp/server.csr" -startdate $START \
    -enddate $END -extensions v3_server -notext -out server.pem 2>"$tmp/log" || { cat "$tmp/log"; exit 1; }
chmod 600 ca-key.pem server-key.pem
openssl verify -CAfile ca.pem server.pem
