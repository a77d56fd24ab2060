#!/usr/bin/env bash
# Regenerates streaming/stan/pb/protocol_pb2.py (+ .pyi) from protocol.proto with grpcio-tools' protoc,
# in a throwaway venv so the project does not depend on grpcio. Commit the result.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(mktemp -d)/venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q grpcio-tools
"$venv/bin/python" -m grpc_tools.protoc -I streaming/stan/pb --python_out=streaming/stan/pb \
    --pyi_out=streaming/stan/pb streaming/stan/pb/protocol.proto
echo "generated streaming/stan/pb/protocol_pb2.py with $("$venv/bin/python" -m grpc_tools.protoc --version)"
