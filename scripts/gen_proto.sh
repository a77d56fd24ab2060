#!/usr/bin/env bash
# Regenerates the protobuf modules with grpcio-tools' protoc, in a throwaway venv so the project does not
# depend on grpcio. Commit the result.
#   streaming/wire/stan_pb/protocol_pb2.py (+ .pyi): the STAN client protocol
#   streaming/stan_import/spb/store_pb2.py (+ .pyi): nats-streaming-server's store records (the importer)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(mktemp -d)/venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q grpcio-tools
for dir in streaming/wire/stan_pb:protocol.proto streaming/stan_import/spb:store.proto; do
    "$venv/bin/python" -m grpc_tools.protoc -I "${dir%%:*}" --python_out="${dir%%:*}" \
        --pyi_out="${dir%%:*}" "${dir%%:*}/${dir##*:}"
done
echo "generated with $("$venv/bin/python" -m grpc_tools.protoc --version)"
