#!/bin/sh
# Generates a throw-away PKI for the TLS tests of every language, into DIR:
#   ca.crt ca.key            the test CA
#   server.crt server.key    signed by the CA, for SAN (default: DNS:localhost,IP:127.0.0.1)
#   client.crt client.key    signed by the CA, for client authentication (mTLS)
#   other-ca.crt             a second CA that signed nothing here (the "wrong CA")
# EC P-256 keys (fast to make), valid two days. Usage: gen-certs.sh DIR [SAN]
set -eu
dir=$1
san=${2:-DNS:localhost,IP:127.0.0.1}
mkdir -p "$dir"
cd "$dir"
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
ca_ext="-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
# shellcheck disable=SC2086
openssl req -x509 $ec -keyout ca.key -out ca.crt -days 2 -subj "/CN=shardlimit test CA" $ca_ext 2>/dev/null
# shellcheck disable=SC2086
openssl req -x509 $ec -keyout other-ca.key -out other-ca.crt -days 2 -subj "/CN=shardlimit other CA" $ca_ext 2>/dev/null
leaf() { # name CN extensions
    # shellcheck disable=SC2086
    openssl req -new $ec -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
    printf '%s\n' "$3" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
        -out "$1.crt" -extfile "$1.ext" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}
leaf server "shardlimit test server" "subjectAltName=$san
basicConstraints=critical,CA:FALSE
extendedKeyUsage=serverAuth"
leaf client "shardlimit test client" "basicConstraints=critical,CA:FALSE
extendedKeyUsage=clientAuth"
chmod 600 ./*.key
