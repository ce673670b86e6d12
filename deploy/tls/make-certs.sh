#!/usr/bin/env bash
# make-certs.sh: the certificates deploy/compose/cluster.yml and deploy/k8s/
# use, made with openssl (P-256 keys, two CAs):
#
#   ca.pem                    router CA: proxies and routerctl trust it
#   control-plane.pem, -key   the control plane's server certificate, for
#                             router-control-plane[.NS[.svc[.cluster.local]]],
#                             control-plane-1..3 (compose), localhost, 127.0.0.1
#   etcd-ca.pem               etcd CA: etcd members and the control plane trust it
#   etcd.pem, etcd-key.pem    etcd's server and peer certificate, for
#                             etcd-0..2.etcd[.NS.svc[.cluster.local]], etcd
#                             (compose), localhost, 127.0.0.1
#   etcd-client.pem, -key     the control plane's etcd client certificate,
#                             common name "router" (with etcd auth on, etcd
#                             takes it as the user name)
#   ca-key.pem, etcd-ca-key.pem  the CAs' keys: keep them off the cluster
#
# Usage: deploy/tls/make-certs.sh OUT_DIR [NAMESPACE]   (NAMESPACE: router)
# Keys are written 0600, certificates 0644. Existing files are kept: delete
# OUT_DIR to make new ones. Valid for CERT_DAYS days (default 825).
set -euo pipefail

out=${1:?usage: make-certs.sh OUT_DIR [NAMESPACE]}
ns=${2:-router}
days=${CERT_DAYS:-825}
mkdir -p "$out"
cd "$out"

if [[ -e ca.pem || -e etcd-ca.pem ]]; then
    echo "make-certs: $out already has certificates; delete it to make new ones" >&2
    exit 1
fi

# key NAME: a P-256 private key in NAME-key.pem, readable by its owner only.
key() {
    (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1-key.pem")
}

# ca NAME COMMON_NAME
ca() {
    key "$1"
    openssl req -x509 -new -key "$1-key.pem" -out "$1.pem" -days "$days" -subj "/CN=$2" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign"
}

# leaf NAME CA COMMON_NAME EXTENDED_KEY_USAGE [SUBJECT_ALT_NAMES]
leaf() {
    local name=$1 issuer=$2 cn=$3 eku=$4 sans=${5:-} ext
    key "$name"
    ext="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=$eku"
    [[ -n $sans ]] && ext+=$'\n'"subjectAltName=$sans"
    openssl req -new -key "$name-key.pem" -subj "/CN=$cn" |
        openssl x509 -req -CA "$issuer.pem" -CAkey "$issuer-key.pem" -set_serial "0x$(openssl rand -hex 16)" \
            -days "$days" -out "$name.pem" -extfile <(printf '%s\n' "$ext")
}

cp_names="DNS:router-control-plane,DNS:router-control-plane.$ns,DNS:router-control-plane.$ns.svc"
cp_names+=",DNS:router-control-plane.$ns.svc.cluster.local"
cp_names+=",DNS:control-plane-1,DNS:control-plane-2,DNS:control-plane-3"
cp_names+=",DNS:localhost,IP:127.0.0.1,IP:::1"
etcd_names="DNS:etcd,DNS:localhost,IP:127.0.0.1"
for i in 0 1 2; do
    etcd_names+=",DNS:etcd-$i.etcd,DNS:etcd-$i.etcd.$ns.svc,DNS:etcd-$i.etcd.$ns.svc.cluster.local"
done

ca ca "router CA"
leaf control-plane ca router-control-plane serverAuth "$cp_names"
ca etcd-ca "router etcd CA"
# Members dial each other (peers) and themselves (gRPC gateway) with it.
leaf etcd etcd-ca etcd serverAuth,clientAuth "$etcd_names"
leaf etcd-client etcd-ca router clientAuth
chmod 0644 ./*.pem
chmod 0600 ./*-key.pem

openssl verify -CAfile ca.pem control-plane.pem
openssl verify -CAfile etcd-ca.pem etcd.pem etcd-client.pem
echo "make-certs: certificates for namespace $ns in $out"
