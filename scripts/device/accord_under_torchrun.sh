#!/usr/bin/env bash
# torchrun's agent holds MASTER_PORT with its own store; Accord's store (hosted by rank 0) takes the next port.
# Since issue 22 the bootstrap does this shift itself under torchrun (TORCHELASTIC_USE_AGENT_STORE=True),
# so today's binaries need no wrapper; this one stays for binaries built before that (before_after.sh's
# base build). Shifting twice is harmless: every rank shifts alike.
export MASTER_PORT=$((MASTER_PORT + 1))
exec "$@"
