#!/usr/bin/env bash
# make kind-e2e: the e2e suite on a kind cluster, with real kubelets running the real images.
# Needs docker, kind, kubectl and helm on PATH (make kind-e2e installs kind with `go install`).
# Set KEEP_CLUSTER=1 to keep the cluster afterwards.
set -euo pipefail

CLUSTER=${CLUSTER:-stator-e2e}
NODE_IMAGE=${NODE_IMAGE:-kindest/node:v1.33.1@sha256:050072256b9a903bd914c0b2866828150cb229cea0efe5892e2b644d5dd3b34f}
MINIO_IMAGE=quay.io/minio/minio:RELEASE.2025-04-22T22-12-26Z
PYTHON=${PYTHON:-.venv/bin/python}
work=$(mktemp -d)
kubeconfig="$work/kubeconfig"
forward_pid=""

cleanup() {
  if [ -n "$forward_pid" ]; then kill "$forward_pid" 2>/dev/null || true; fi
  if [ "${KEEP_CLUSTER:-0}" != 1 ]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== images"
docker build -q -f images/runtime/Dockerfile -t stator-runtime:dev .
docker build -q -f tests/e2e/kind/Dockerfile.runtime-test -t stator-runtime:test .
docker build -q -f images/operator/Dockerfile -t stator-operator:e2e .
docker pull -q "$MINIO_IMAGE"

echo "== cluster"
# Three workers: executor pods spread over nodes, and one can be lost (docker pause).
kind create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --kubeconfig "$kubeconfig" \
  --config tests/e2e/kind/cluster.yaml --wait 120s
for image in stator-runtime:test stator-operator:e2e "$MINIO_IMAGE"; do
  kind load docker-image --name "$CLUSTER" "$image"
done
export KUBECONFIG="$kubeconfig"

echo "== MinIO"
access_key="e2e$(openssl rand -hex 6)"
secret_key=$(openssl rand -hex 20)
kubectl create namespace stator-e2e
kubectl create secret generic minio-root -n stator-e2e \
  --from-literal=MINIO_ROOT_USER="$access_key" --from-literal=MINIO_ROOT_PASSWORD="$secret_key"
kubectl apply -f tests/e2e/kind/minio.yaml
kubectl rollout status deployment/minio -n stator-e2e --timeout=180s
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
kubectl port-forward -n stator-e2e --address 127.0.0.1 svc/minio "$port:9000" >"$work/forward.log" 2>&1 &
forward_pid=$!
for _ in $(seq 60); do
  if curl -fs "http://127.0.0.1:$port/minio/health/live" >/dev/null; then break; fi
  sleep 1
done

echo "== operator (Helm chart, namespaced mode: the namespaces the suite uses, tests/e2e/cluster.py)"
watched=$(seq -f 'e2e-%02g' 0 31 | paste -sd, -)
for ns in ${watched//,/ }; do kubectl create namespace "$ns" >/dev/null; done
helm install stator charts/stator-operator --namespace stator-system --create-namespace \
  --set image.repository=stator-operator --set image.tag=e2e \
  --set "watchNamespaces={$watched}" --set leaderElection.leaseDurationSeconds=6 \
  --wait --timeout 180s

echo "== e2e suite"
STATOR_E2E_KUBECONFIG="$kubeconfig" \
STATOR_E2E_S3_ENDPOINT="http://127.0.0.1:$port" \
STATOR_E2E_S3_POD_ENDPOINT="http://minio.stator-e2e.svc.cluster.local:9000" \
STATOR_E2E_S3_ACCESS_KEY="$access_key" \
STATOR_E2E_S3_SECRET_KEY="$secret_key" \
STATOR_E2E_LOCAL_STORAGE_CLASS=standard \
  "$PYTHON" -m pytest tests/e2e "$@"
