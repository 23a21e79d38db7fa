//! The table itself. Add a row with the knob's parser; the component's tests check that its
//! parser reads exactly its rows, and `accord-knobs`' tests that the README and every
//! `"ACCORD_..."` literal in the tree agree with the table.

use crate::Component::{Collectives, Cuda, Engine, GpuCollectives, Plugin, SharedMemory, Tools, Tuner, Udp};
use crate::Kind::{Bytes, Choice, Count, Gbps, List, Mbps, Micros, Millis, Path, Probability, Switch, Text};
use crate::Knob;

const fn knob(
    name: &'static str,
    component: crate::Component,
    kind: crate::Kind,
    default: &'static str,
    doc: &'static str,
) -> Knob {
    Knob { name, component, kind, default, doc }
}

/// Every knob of the workspace.
pub static KNOBS: &[Knob] = &[
    // ---- Engine ----
    knob("ACCORD_NICS", Engine, List, "127.0.0.1", "local IPs, one per NIC the engine drives"),
    knob(
        "ACCORD_WORKERS_PER_NIC",
        Engine,
        Count,
        "derived",
        "worker threads per NIC; unset: half the cores over the ranks a launcher says share the host (1..=8), else 1",
    ),
    knob("ACCORD_PATHS", Engine, Count, "4", "paths (UDP sockets, entropy values) per worker"),
    knob("ACCORD_CC", Engine, Choice(&["cubic", "swift", "eqds", "fixed"]), "cubic", "congestion control"),
    knob(
        "ACCORD_PATH_SELECTOR",
        Engine,
        Choice(&["p2c", "rr", "recycle"]),
        "p2c",
        "how a chunk's path is picked: power of two choices on RTT, round robin, or reuse of paths acked clean",
    ),
    knob(
        "ACCORD_PACER_ORDER",
        Engine,
        Choice(&["rr", "srpt"]),
        "rr",
        "order of the EQDS credit pacer: max-min fair, or shortest remaining first",
    ),
    knob("ACCORD_NIC_GBPS", Engine, Gbps, "100", "line rate of each NIC, for the EQDS credit pacer"),
    knob("ACCORD_FORCE_NETWORK", Engine, Switch, "0", "peers in this process go over the network routes too"),
    knob("ACCORD_DATAGRAM_BYTES", Engine, Bytes, "0", "datagram size; 0: by address (loopback or fabric size)"),
    knob("ACCORD_WINDOW_PACKETS", Engine, Count, "0", "send window in packets; 0: sized to the socket buffers"),
    knob("ACCORD_SHARD_BYTES", Engine, Bytes, "262144", "writes at least this long are split across lanes"),
    knob(
        "ACCORD_IDLE_TIMEOUT_MS",
        Engine,
        Millis,
        "5000",
        "a connection silent this long with data outstanding fails",
    ),
    knob(
        "ACCORD_AWAIT_POLL_US",
        Engine,
        Micros,
        "500",
        "how long a worker that awaits traffic polls (yielding the core) before it sleeps; 0: off",
    ),
    knob(
        "ACCORD_WAIT_SPIN_US",
        Engine,
        Micros,
        "by cores",
        "how long a thread waiting on a transfer or a counter polls before it sleeps",
    ),
    knob("ACCORD_CMA", Engine, Switch, "0", "large writes to other processes of this host are pulled by the receiver"),
    knob("ACCORD_CMA_MIN_BYTES", Engine, Bytes, "65536", "the shortest write the pull route takes"),
    knob(
        "ACCORD_RX_BATCH_SLOTS",
        Engine,
        Count,
        "0",
        "receive slots per batch, 1..=64; 0: by datapath",
    ),
    knob("ACCORD_ENGINE_DEBUG", Engine, Switch, "-", "set: workers print per-connection statistics every 250 ms"),
    knob(
        "ACCORD_DEVICE_IPC",
        Engine,
        Switch,
        "1",
        "device memory of same-host peers through CUDA IPC; 0 takes the cross-host routes on one host",
    ),
    knob(
        "ACCORD_DEVICE_SHARED_HOST",
        Engine,
        Switch,
        "1",
        "device bytes bound for a same-host peer's `alloc_shared` region are copied straight in; 0 stages them",
    ),
    knob(
        "ACCORD_DEVICE_CONTEXT",
        Engine,
        Choice(&["primary", "private"]),
        "primary",
        "the CUDA context copies are submitted in; private keeps them from waiting behind the application's",
    ),
    knob("ACCORD_DEVICE_STAGING_CHUNK_BYTES", Engine, Bytes, "4194304", "bytes per pinned staging slot"),
    knob("ACCORD_DEVICE_STAGING_CHUNKS", Engine, Count, "8", "pinned staging slots per engine"),
    knob(
        "ACCORD_DEVICE_LANDING_TIMEOUT_MS",
        Engine,
        Millis,
        "10000",
        "how long a device-landing rendezvous waits for a quiet peer",
    ),
    knob("ACCORD_LOSS", Engine, Probability, "0", "inject this packet loss (tests, benchmarks)"),
    knob("ACCORD_REORDER", Engine, Probability, "0", "inject this reordering (tests, benchmarks)"),
    // ---- Shared-memory datapath ----
    knob("ACCORD_SHM", SharedMemory, Switch, "1", "same-host peers exchange datagrams through shared-memory rings"),
    knob(
        "ACCORD_SHM_RING_BYTES",
        SharedMemory,
        Bytes,
        "8388608",
        "data bytes of each ring, a power of two in 256 KiB..=1 GiB",
    ),
    knob("ACCORD_SHM_DIR", SharedMemory, Path, "/dev/shm", "where ring files live; both peers must see the same one"),
    knob("ACCORD_SHM_SPIN_US", SharedMemory, Micros, "50", "how long a receiver polls rings and sockets before it sleeps"),
    knob("ACCORD_SHM_LEND", SharedMemory, Switch, "1", "large datagrams are placed straight from the ring"),
    // ---- UDP datapath ----
    knob("ACCORD_NET_UDP_PATHS", Udp, Count, "4", "sockets (paths) per datapath"),
    knob("ACCORD_NET_UDP_BASE_PORT", Udp, Count, "0", "port of path 0 (path i binds base + i); 0: ephemeral ports"),
    knob("ACCORD_NET_UDP_RCVBUF_BYTES", Udp, Bytes, "4194304", "SO_RCVBUF per socket"),
    knob("ACCORD_NET_UDP_SNDBUF_BYTES", Udp, Bytes, "4194304", "SO_SNDBUF per socket"),
    knob("ACCORD_NET_UDP_GSO", Udp, Switch, "1", "segmentation offload where the kernel has it"),
    knob("ACCORD_NET_UDP_GRO", Udp, Switch, "1", "receive coalescing where the kernel has it"),
    // ---- Collectives ----
    knob("ACCORD_COLL_TIMEOUT_MS", Collectives, Millis, "60000", "deadline of every wait inside a collective"),
    knob(
        "ACCORD_COLL_ABORT_GRACE_MS",
        Collectives,
        Millis,
        "200",
        "how long a failed rank keeps telling the others before it returns",
    ),
    knob("ACCORD_COLL_SCRATCH_BYTES_MAX", Collectives, Bytes, "4294967296", "largest scratch buffer a collective takes"),
    knob(
        "ACCORD_COLL_PIPELINE_CHUNK_BYTES",
        Collectives,
        Bytes,
        "262144",
        "chunk of the pipelined algorithms",
    ),
    knob("ACCORD_COLL_SEGMENT_BYTES", Collectives, Bytes, "131072", "segment of the segmented algorithms"),
    knob(
        "ACCORD_ALGO_*",
        Collectives,
        Text,
        "by size",
        "algorithm forced for one collective, e.g. `ACCORD_ALGO_ALL_REDUCE=ring`; set it identically on every rank",
    ),
    knob(
        "ACCORD_BOOTSTRAP_TIMEOUT_MS",
        Collectives,
        Millis,
        "300000",
        "how long the bootstrap waits for every rank to arrive",
    ),
    // ---- GPU collectives ----
    knob(
        "ACCORD_GPU_STREAM_ORDER",
        GpuCollectives,
        Choice(&["hostfn", "stall"]),
        "hostfn",
        "how a collective keeps the caller's stream order",
    ),
    knob("ACCORD_GPU_SCRATCH_BYTES", GpuCollectives, Bytes, "134217728", "scratch bytes per communicator"),
    knob("ACCORD_GPU_MAPPINGS_MAX", GpuCollectives, Count, "256", "peer IPC mappings cached"),
    knob("ACCORD_GPU_REGISTRATIONS_MAX", GpuCollectives, Count, "1024", "user buffers registered at once"),
    knob("ACCORD_GPU_OP_TIMEOUT_MS", GpuCollectives, Millis, "60000", "deadline of one GPU collective"),
    knob("ACCORD_GPU_QUEUE_DEPTH", GpuCollectives, Count, "64", "collectives queued per communicator"),
    knob("ACCORD_GPU_STREAMS_PER_PEER", GpuCollectives, Count, "1", "copy streams per peer"),
    knob("ACCORD_GPU_PIPELINE_CHUNK_BYTES", GpuCollectives, Bytes, "16777216", "chunk of the pipelined all_reduce"),
    knob("ACCORD_GPU_PIPELINE_CHUNKS_MAX", GpuCollectives, Count, "16", "chunks in flight of the pipelined all_reduce"),
    // ---- NCCL plugin ----
    knob(
        "ACCORD_NET_IFS",
        Plugin,
        List,
        "127.0.0.1",
        "local IPs or interface names, one NCCL device each; a multi-host job left on the default fails at its first connect",
    ),
    knob(
        "ACCORD_NET_SPEED_MBPS",
        Plugin,
        Mbps,
        "derived",
        "speed each device reports to NCCL; default the interface's, 400000 on loopback, else 100000",
    ),
    knob("ACCORD_NET_SETUP_TIMEOUT_MS", Plugin, Millis, "300000", "connect and accept give up after this long"),
    knob(
        "ACCORD_NET_PIECES",
        Plugin,
        Count,
        "lanes",
        "most pieces a receive is written in, each on its own lane; 0 or 1: one write the engine shards",
    ),
    knob(
        "ACCORD_NET_GPU_BUFFERS",
        Plugin,
        Choice(&["0", "1", "auto"]),
        "0",
        "devices accept GPU memory (NCCL_PTR_CUDA) and the GPUs' copy engines move the bytes",
    ),
    knob(
        "ACCORD_NET_BOUNCE_BYTES",
        Plugin,
        Bytes,
        "16777216",
        "each receive comm's shared host bounce pool for receives into GPU memory",
    ),
    knob("ACCORD_NET_TRACE", Plugin, Count, "0", "log the first N data-path events (NCCL_DEBUG=INFO, NET)"),
    // ---- NCCL tuner ----
    knob("ACCORD_TUNER", Tuner, Switch, "1", "0: NCCL's own protocol and channel choices"),
    knob("ACCORD_TUNER_MIN_BYTES", Tuner, Bytes, "131072", "collectives at least this long are tuned"),
    knob("ACCORD_TUNER_CHANNEL_BYTES", Tuner, Bytes, "2097152", "bytes of a collective per channel"),
    knob("ACCORD_TUNER_LOG", Tuner, Switch, "0", "log each decision once per collective and size"),
    // ---- CUDA ----
    knob("ACCORD_CUDA_LIB_DIRS", Cuda, List, "-", "extra directories searched for libcuda and libnvrtc"),
    knob("ACCORD_CUDA_INCLUDE_DIRS", Cuda, List, "-", "extra include directories for NVRTC kernels"),
    // ---- Diagnostics, benches, tests ----
    knob(
        "ACCORD_LOG",
        Tools,
        Text,
        "warn",
        "log filter (`RUST_LOG` syntax, e.g. `debug` or `accord_engine=trace`): the CLI's stderr, Python's `logging`, NCCL's logger; unset: `RUST_LOG`",
    ),
    knob(
        "ACCORD_BENCH_CORRUPT",
        Tools,
        Switch,
        "0",
        "test only: `accord bench` corrupts one output value, to prove the check fails the run",
    ),
    knob("ACCORD_PROPTEST_SEEDS", Tools, Count, "500", "seeds of the simulator's property tests"),
    knob("ACCORD_PROPTEST_SEED", Tools, Count, "-", "run the property tests on this one seed"),
    knob("ACCORD_PROPTEST_VERBOSE", Tools, Switch, "-", "set: the property tests print every seed"),
    knob("ACCORD_SIM_DIAGNOSE", Tools, Switch, "-", "set: the simulator's pair harness explains a failed connection"),
    knob("ACCORD_P2P_BENCH_MAX", Tools, Bytes, "1048576", "largest message of the p2p bench's child (set by the bench)"),
    knob("ACCORD_PYENV", Tools, Path, "target/pyenv", "virtualenv of `scripts/python-test.sh`"),
    knob("ACCORD_TEST_TORCH", Tools, Switch, "1", "0: `scripts/python-test.sh` does not install torch, and the torch tests skip"),
];

/// Variables our own launchers and test harnesses set for the child processes they start
/// (roles, ports, markers): known, so a child never warns about them, but no user setting.
pub static INTERNAL: &[&str] = &[
    "ACCORD_BENCH_RANK",
    "ACCORD_LAUNCH_WATCHDOG",
    "ACCORD_BENCH_PROGRESS",
    "ACCORD_LIFECYCLE_TEST",
    "ACCORD_PY_LIFECYCLE_TEST",
    "ACCORD_BENCH_CHILD",
    "ACCORD_P2P_BENCH_CHILD",
    "ACCORD_P2P_BENCH_LOSS",
    "ACCORD_MP_ROLE",
    "ACCORD_CMA_TEST_ROLE",
    "ACCORD_DEVICE_MP_ROLE",
    "ACCORD_DEVICE_MP_ORDINAL",
    "ACCORD_DEVICE_MP_HOST_BYTES",
    "ACCORD_GPU_TEST_RANK",
    "ACCORD_GPU_TEST_PORT",
    "ACCORD_NCCL_CHILD",
    "ACCORD_NCCL_GROUPS",
    "ACCORD_NCCL_SLOW_CONNECT_RANK",
    "ACCORD_CUDA_CHECK_IPC_CHILD",
    "ACCORD_CUDA_CHECK_IPC_GPU",
];
