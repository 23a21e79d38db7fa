#!/usr/bin/env bash
# torchrun's agent holds MASTER_PORT with its own store; Accord's store (hosted by rank 0) takes the next port.
export MASTER_PORT=$((MASTER_PORT + 1))
exec "$@"
