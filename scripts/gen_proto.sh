#!/usr/bin/env bash
# Regenerates streaming/wire/stan_pb/protocol_pb2.py (+ .pyi) from protocol.proto with grpcio-tools' protoc,
# in a throwaway venv so the project does not depend on grpcio. Commit the result.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(mktemp -d)/venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q grpcio-tools
"$venv/bin/python" -m grpc_tools.protoc -I streaming/wire/stan_pb --python_out=streaming/wire/stan_pb \
    --pyi_out=streaming/wire/stan_pb streaming/wire/stan_pb/protocol.proto
echo "generated streaming/wire/stan_pb/protocol_pb2.py with $("$venv/bin/python" -m grpc_tools.protoc --version)"
