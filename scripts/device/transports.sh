# The NCCL transports the device scripts compare, one definition for all of them (sourced by
# scripts/device/nccl_tests.sh and scripts/device/ddp_transports.sh, so a transport means the
# same environment in every table).
#
#   transport_env NAME PLUGIN_DIR  prints the transport's VAR=value words on one line
#                                  ("UNKNOWN" for a name it does not know)
#
#   nvlink      P2P and SHM on: the ceiling
#   socket      NCCL's Socket, tuned (4 threads x 4 sockets); socket_default untuned
#   accord      the Accord plugin's defaults (PLUGIN_DIR holds libnccl-net-accord.so): the host path
#   accord_host ACCORD_NET_GPU_BUFFERS=0 said explicitly (the host path whatever the default)
#   accord_gpu_auto  ACCORD_NET_GPU_BUFFERS=auto and nothing else: the plugin sets
#               NCCL_NET_GDR_LEVEL=SYS itself (ACCORD_NET_GDR_LEVEL's default), no NCCL_* by hand
#   accord_gpu  ACCORD_NET_GPU_BUFFERS=1 with NCCL_NET_GDR_LEVEL=SYS NCCL_NET_GDR_READ=1 set by hand
#               (without them, and before the plugin set the level, NCCL kept its buffers in host
#               memory: a loopback NIC has no PCI path near a GPU)
#   accord_gpu_noread  accord_gpu_auto with NCCL_NET_GDR_READ=0: NCCL stages sends through host
#               memory and only receives land in GPU memory, one copy in the plugin's own CUDA
#               context per step instead of two (a test of why GPU buffers lose under DDP)
#   accord_gpu_primary  accord_gpu_auto with ACCORD_DEVICE_CONTEXT=primary: the plugin's copies in
#               the primary context, beside NCCL's and the application's kernels, instead of a
#               context of its own (a diagnostic of whether time-slicing between the two contexts
#               is what GPU buffers lose under DDP; an application thread's synchronous pageable
#               cudaMemcpy behind a waiting kernel can deadlock it, see accord-nccl-net's config)
#   accord_net  ACCORD_FORCE_NETWORK=1: no in-process copy route
#   accord_nostream  ACCORD_NET_STREAMING_STORES=0: bytes land in NCCL's host buffers with plain
#               stores, as before stop 49 (the baseline of the streaming stores)
#   accord_ring8m  ACCORD_SHM_RING_BYTES=8388608: the engine's 8 MiB shared-memory rings, the
#               plugin's default before session 50 (the baseline of its smaller rings)
#   accord_ring1m  ACCORD_SHM_RING_BYTES=1048576: 1 MiB rings said explicitly (the plugin's default
#               since the end of session 50)
#   accord_ring2m  ACCORD_SHM_RING_BYTES=2097152: the plugin's 2 MiB rings of session 50's calls 4-6
#   accord_timed  the plugin's defaults with ACCORD_ENGINE_DEBUG=1: every worker prints where its
#               time goes (receive, transmit, poll, ...) every 250 ms on stderr, and with
#               NCCL_DEBUG=INFO the finalize line sums the lanes (what bounds a shape)
#   accord_w8   the plugin's defaults with ACCORD_WORKERS_PER_NIC=8: the worker count one process per
#               GPU got on a 32-core host before the plugin sized its own (stop 42)
#   accord_cma  ACCORD_CMA=1: receivers pull large sends with process_vm_readv
#   accord_w4   ACCORD_WORKERS_PER_NIC=4: few workers (does the training process lose cores to them?)
#   accord_nopoll  ACCORD_AWAIT_POLL_US=0 ACCORD_SHM_SPIN_US=0: idle workers sleep at once instead
#               of polling (the same question, asked of their idle polling)
#   accord_spin ACCORD_SHM_SPIN_US=2000 ACCORD_AWAIT_POLL_US=5000: idle workers and receivers
#               poll longer before they sleep (the other side of accord_nopoll; the plugin's
#               default in stop 43 only: no reliable gain under DDP, see README)
#   accord_enginepoll ACCORD_AWAIT_POLL_US=500 ACCORD_SHM_SPIN_US=50: the engine's own poll windows
#               spelled out (the plugin's default again since stop 44; the baseline accord_spin
#               was paired with)
#
# Any name may carry extra settings after "+": "accord+ACCORD_TUNER=0+NCCL_BUFFSIZE=1048576" is
# accord's environment with those two words added, so a one-off sweep needs no new name here
# (the name is also the log file's, so keep values to letters, digits, "_", "." and "=").
transport_env() {
    local base=${1%%+*} extra="" word
    if [ "$base" != "$1" ]; then
        extra=${1#*+}
        extra=${extra//+/ }
        # Every extra word must be VAR=value: a bare word would become the command `env` runs.
        for word in $extra; do
            [[ "$word" =~ ^[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_.=]*$ ]] || { echo UNKNOWN; return; }
        done
    fi
    local words
    words=$(transport_env_base "$base" "$2")
    if [ "$words" = UNKNOWN ]; then echo UNKNOWN; else echo "$words $extra"; fi
}

transport_env_base() {
    local net_only="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"
    local accord="NCCL_NET=Accord NCCL_NET_PLUGIN=$2/libnccl-net-accord.so LD_LIBRARY_PATH=$2:${LD_LIBRARY_PATH:-} ACCORD_NET_IFS=${ACCORD_NET_IFS:-127.0.0.1}"
    case "$1" in
        nvlink) echo "" ;;
        socket) echo "$net_only NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4" ;;
        socket_default) echo "$net_only NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo" ;;
        accord) echo "$net_only $accord" ;;
        accord_host) echo "$net_only $accord ACCORD_NET_GPU_BUFFERS=0" ;;
        accord_gpu_auto) echo "$net_only $accord ACCORD_NET_GPU_BUFFERS=auto" ;;
        accord_gpu_primary) echo "$net_only $accord ACCORD_NET_GPU_BUFFERS=auto ACCORD_DEVICE_CONTEXT=primary" ;;
        accord_gpu_noread) echo "$net_only $accord ACCORD_NET_GPU_BUFFERS=auto NCCL_NET_GDR_READ=0" ;;
        accord_gpu) echo "$net_only $accord ACCORD_NET_GPU_BUFFERS=1 NCCL_NET_GDR_LEVEL=SYS NCCL_NET_GDR_READ=1" ;;
        accord_net) echo "$net_only $accord ACCORD_FORCE_NETWORK=1" ;;
        accord_nostream) echo "$net_only $accord ACCORD_NET_STREAMING_STORES=0" ;;
        accord_ring8m) echo "$net_only $accord ACCORD_SHM_RING_BYTES=8388608" ;;
        accord_ring1m) echo "$net_only $accord ACCORD_SHM_RING_BYTES=1048576" ;;
        accord_ring2m) echo "$net_only $accord ACCORD_SHM_RING_BYTES=2097152" ;;
        accord_timed) echo "$net_only $accord ACCORD_ENGINE_DEBUG=1" ;;
        accord_w8) echo "$net_only $accord ACCORD_WORKERS_PER_NIC=8" ;;
        accord_cma) echo "$net_only $accord ACCORD_CMA=1" ;;
        accord_w4) echo "$net_only $accord ACCORD_WORKERS_PER_NIC=4" ;;
        accord_nopoll) echo "$net_only $accord ACCORD_AWAIT_POLL_US=0 ACCORD_SHM_SPIN_US=0" ;;
        accord_spin) echo "$net_only $accord ACCORD_SHM_SPIN_US=2000 ACCORD_AWAIT_POLL_US=5000" ;;
        accord_enginepoll) echo "$net_only $accord ACCORD_AWAIT_POLL_US=500 ACCORD_SHM_SPIN_US=50" ;;
        *) echo "UNKNOWN" ;;
    esac
}
