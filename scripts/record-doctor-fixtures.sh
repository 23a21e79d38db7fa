#!/usr/bin/env bash
# Records the stuck reports that crates/accord-cli/tests/fixtures/doctor holds, from real runs:
# 3 ranks of `accord bench all-reduce`, one per process, reports to $OUT/NAME (default
# /tmp/accord-doctor/NAME). ACTION: kill (kill -9 rank 2), stop (SIGSTOP rank 2), usr1 (SIGUSR1
# to every rank, then kill them all). The fixtures were recorded with:
#   scripts/record-doctor-fixtures.sh killed kill
#   scripts/record-doctor-fixtures.sh stopped stop
#   EXTRA_ENV="ACCORD_LOSS=0.05" BYTES=16M ITERS=100000 SETTLE=3 TIMEOUT_MS=20000 \
#       scripts/record-doctor-fixtures.sh lossy usr1
set -u
NAME=$1; ACTION=$2
BIN=${ACCORD_BIN:-target/release/accord}
DIR=${OUT:-/tmp/accord-doctor}/$NAME; rm -rf "$DIR"; mkdir -p "$DIR"
PORT=$((21000 + RANDOM % 5000))
pids=()
for r in 0 1 2; do
  extra=()
  env RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT ACCORD_BENCH_RANK=1 \
  ACCORD_COLL_TIMEOUT_MS=${TIMEOUT_MS:-3000} ACCORD_REPORT_DIR=$DIR ${EXTRA_ENV:-} \
  $BIN bench all-reduce --ranks 3 -b ${BYTES:-64M} -e ${BYTES:-64M} -w 0 -n ${ITERS:-50} > "$DIR/out$r.txt" 2>&1 &
  pids+=($!)
done
sleep ${SETTLE:-1.5}
t0=$(date +%s.%N)
case $ACTION in
  kill) kill -9 ${pids[2]} ;;
  stop) kill -STOP ${pids[2]} ;;
  usr1) kill -USR1 ${pids[0]} ${pids[1]} ${pids[2]}; sleep 1; kill -9 ${pids[0]} ${pids[1]} ${pids[2]} ;;
esac
for i in 0 1; do wait ${pids[$i]}; echo "rank $i exit $? after $(echo "$(date +%s.%N) - $t0" | bc) s"; done
case $ACTION in stop) kill -9 ${pids[2]}; wait ${pids[2]} ;; usr1) wait ${pids[2]} ;; esac
ls $DIR
