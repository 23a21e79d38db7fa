//! Building a [`GpuCommunicator`]: the constructors, the setup they share (the flag board, the
//! scratch, the direct calls' inbox, the kernels, the progress thread), and the export of a
//! registration onto the board.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use accord_cuda::ipc::vmm::{export_vmm_range, VmmExport};
use accord_cuda::{
    has_owner_context, DeviceBuffer, DevicePtr, Event, EventKind, Gpu, IpcHandle, Reducer, StallGate, Stream,
};

use super::board::{Board, Exported, Registered, GPU_WORLD_SIZE_MAX};
use super::caller_reduce::CallerReduce;
use super::config::{GpuConfig, StreamOrder};
use super::error::{GpuCollError, GpuResult};
use super::registry::{PeerMappings, Registrations};
use super::worker::{self, MemoryGate, Shared, Worker};
use super::{direct, marks, pipeline_streams, GpuCommunicator};
use crate::error::StoreError;
use crate::store::{all_gather_through, Bootstrap, KeyValueStore};

/// How the constructors meet: all-gathers one blob over the ranks (the bootstrap's exchange, or
/// one through an outside store).
type Meet<'a> = dyn FnMut(&[u8]) -> Result<Vec<Vec<u8>>, StoreError> + 'a;

/// Loads the reduction kernels (every type NVRTC can build here) and the
/// stall kernel, and launches each once.
fn warm_kernels(gpu: &Gpu, blocks_max: u32) -> GpuResult<(Option<Reducer>, Arc<StallGate>)> {
    let reducer = warm_reducer(gpu, blocks_max)?;
    let stream = Stream::new(gpu)?;
    let gate = Arc::new(StallGate::new(gpu)?);
    let ticket = gate.stall(&stream, Duration::from_secs(10))?;
    gate.release(ticket);
    stream.synchronize()?;
    Ok((reducer, gate))
}

/// Loads the reduction kernels (every type NVRTC can build here) in `gpu`'s context and
/// launches each once; None where NVRTC is missing.
fn warm_reducer(gpu: &Gpu, blocks_max: u32) -> GpuResult<Option<Reducer>> {
    let all = [
        accord_cuda::DType::F32,
        accord_cuda::DType::I32,
        accord_cuda::DType::I64,
        accord_cuda::DType::F16,
        accord_cuda::DType::BF16,
    ];
    let reducer = match Reducer::new(gpu) {
        Ok(r) => Some((r, &all[..])),
        Err(e) => {
            tracing::warn!(error = %e, "half-precision reduction kernels unavailable; float and integer only");
            Reducer::with_types(gpu, &all[..3]).ok().map(|r| (r, &all[..3]))
        }
    };
    let stream = Stream::new(gpu)?;
    let scratch = DeviceBuffer::alloc(gpu, 64)?;
    if let Some((reducer, types)) = &reducer {
        for dtype in *types {
            for op in [
                accord_cuda::ReduceOp::Sum,
                accord_cuda::ReduceOp::Prod,
                accord_cuda::ReduceOp::Min,
                accord_cuda::ReduceOp::Max,
                accord_cuda::ReduceOp::Avg { divisor: 1 },
            ] {
                reducer.reduce(scratch.ptr(), scratch.ptr(), scratch.ptr(), 1, *dtype, op, &stream)?;
            }
        }
    }
    stream.synchronize()?;
    Ok(reducer.map(|(r, _)| r.with_blocks_max(blocks_max)))
}

impl GpuCommunicator {
    /// Bootstraps from torchrun's variables and [`GpuConfig::from_env`].
    pub fn from_env() -> GpuResult<GpuCommunicator> {
        GpuCommunicator::new(Bootstrap::from_env()?, GpuConfig::from_env()?)
    }

    /// Opens GPU `LOCAL_RANK`, sets up the flag board, the scratch buffer and
    /// the progress thread. Every rank of `bootstrap` must call it.
    pub fn new(mut bootstrap: Bootstrap, config: GpuConfig) -> GpuResult<GpuCommunicator> {
        let bc = bootstrap.config().clone();
        let mut meet = |blob: &[u8]| bootstrap.all_gather(blob);
        let mut comm = GpuCommunicator::start(bc.rank, bc.world_size, bc.local_rank, &mut meet, config)?;
        comm.bootstrap = Some(bootstrap);
        Ok(comm)
    }

    /// Joins the communicator of `world_size` ranks through `store`, a key-value store the job
    /// already runs (PyTorch's c10d store), under keys starting with `prefix` (give each
    /// communicator its own). This rank uses GPU `gpu_ordinal` (as the process sees it).
    /// Waits up to `timeout` for each peer. Every rank must call it.
    pub fn join(
        store: &mut dyn KeyValueStore,
        prefix: &str,
        rank: usize,
        world_size: usize,
        gpu_ordinal: usize,
        timeout: Duration,
        config: GpuConfig,
    ) -> GpuResult<GpuCommunicator> {
        let mut round = 0;
        let mut meet = |blob: &[u8]| {
            round += 1;
            all_gather_through(store, &format!("{prefix}{round}/"), rank, world_size, blob, timeout)
        };
        GpuCommunicator::start(rank, world_size, gpu_ordinal, &mut meet, config)
    }

    /// The setup both constructors share: `meet` all-gathers a blob over the ranks.
    fn start(
        rank: usize,
        world_size: usize,
        gpu_ordinal: usize,
        meet: &mut Meet<'_>,
        config: GpuConfig,
    ) -> GpuResult<GpuCommunicator> {
        if world_size > GPU_WORLD_SIZE_MAX || rank >= world_size {
            return Err(GpuCollError::InvalidArgument {
                what: format!(
                    "GPU collectives run at most {GPU_WORLD_SIZE_MAX} ranks on one host (rank {rank} of {world_size})"
                ),
            });
        }
        check_order(&config, config.stream_order)?;
        let callers_gpu = Gpu::open(gpu_ordinal)?;
        let gpu = if config.private_context { Gpu::open_private(gpu_ordinal)? } else { callers_gpu.clone() };
        let (board, blob) = if rank == 0 {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            let path = PathBuf::from(format!("/dev/shm/accord-gpu-{}-{nanos}", std::process::id()));
            let board = Board::create(&path, world_size)?;
            board.init_header();
            (Some(board), path.display().to_string().into_bytes())
        } else {
            (None, Vec::new())
        };
        let blobs = meet(&blob)?;
        let path = PathBuf::from(String::from_utf8_lossy(&blobs[0]).into_owned());
        let board = match board {
            Some(b) => b,
            None => Board::open(&path, world_size)?,
        };
        board.check_header()?;
        board.open_rank(rank, std::process::id());
        // The scratch and the direct inbox take one registration each besides the caller's.
        let mut registrations = Registrations::new(config.registrations_max.saturating_add(2));
        // In a private context the scratch is VMM memory, which no context owns (a copy of
        // cuMemAlloc memory would wait behind its owner's synchronous calls again).
        let scratch = if config.private_context {
            DeviceBuffer::alloc_shareable(&gpu, config.scratch_bytes)?
        } else {
            DeviceBuffer::alloc(&gpu, config.scratch_bytes)?
        };
        let scratch_reg = registrations.insert(scratch.ptr().0, scratch.len_bytes())?;
        let vmm_exports = VmmExports::default();
        publish(&board, rank, scratch_reg, &gpu, (scratch.ptr(), scratch.len_bytes()), &vmm_exports)?;
        // Kernels are loaded (and, under CUDA's lazy loading, first launched) here, never while a
        // user stream is held by a collective: loading may synchronise the context, which would
        // wait for that held stream (a deadlock).
        let (reducer, stall_gate) = warm_kernels(&gpu, config.reduce_blocks(gpu.multiprocessor_count()))?;
        let reducer = reducer.map(Arc::new);
        // In the primary context the progress thread's kernels serve the caller's streams too; a
        // private context's cannot, so the caller's context gets its own.
        let callers_reducer = if !(config.reduce_on_caller || config.direct_bytes > 0) {
            None
        } else if config.private_context {
            warm_reducer(&callers_gpu, config.reduce_blocks(callers_gpu.multiprocessor_count()))?.map(Arc::new)
        } else {
            reducer.clone()
        };
        let inbox = direct::setup::inbox(&config, world_size, callers_reducer.is_some(), &callers_gpu)?;
        let (inbox_reg, slot) = match &inbox {
            Some((buf, slot)) => {
                let id = registrations.insert(buf.ptr().0, buf.len_bytes())?;
                publish(&board, rank, id, &callers_gpu, (buf.ptr(), buf.len_bytes()), &vmm_exports)?;
                (id, *slot)
            }
            None => (0, 0),
        };
        let mut blob = inbox_reg.to_le_bytes().to_vec();
        blob.extend_from_slice(&(slot as u64).to_le_bytes());
        let inboxes = direct::setup::inboxes_of(&meet(&blob)?, slot)?;
        if rank == 0 {
            board.unlink()?;
        }
        let shared = Arc::new(Shared {
            board,
            error: Mutex::new(None),
            completed: AtomicU64::new(0),
            mappings_opened: AtomicU64::new(0),
        });
        let memory_gate = Arc::new(MemoryGate::new(&gpu)?);
        let direct = match (inbox, callers_reducer.clone()) {
            (Some((inbox, _)), Some(reducer)) => {
                let peer_inboxes = direct::setup::map_peer_inboxes(&callers_gpu, &shared.board, rank, &inboxes)?;
                Some(direct::DirectCalls::open(direct::Parts {
                    rank,
                    world_size,
                    gpu: &callers_gpu,
                    reducer,
                    shared: Arc::clone(&shared),
                    inbox,
                    peer_inboxes,
                    slot_bytes: slot,
                    op_timeout: config.op_timeout,
                })?)
            }
            _ => None,
        };
        let caller_reduce = if config.reduce_on_caller {
            match callers_reducer {
                Some(r) => Some(Arc::new(CallerReduce::new(&callers_gpu, r)?)),
                None => {
                    tracing::warn!("ACCORD_GPU_REDUCE_ON_CALLER: no reduction kernels in the caller's context (NVRTC); the progress thread reduces");
                    None
                }
            }
        } else {
            None
        };
        let (peer_streams, peer_events) = worker::peer_streams(&gpu, world_size, rank, config.streams_per_peer)?;
        let worker = Worker {
            rank,
            world_size,
            gpu: gpu.clone(),
            shared: Arc::clone(&shared),
            peer_streams,
            peer_events,
            local_stream: Stream::new(&gpu)?,
            local_event: Event::new(&gpu, EventKind::SyncOnly)?,
            scratch: (scratch.ptr(), scratch_reg),
            reducer,
            mappings: PeerMappings::new(gpu.clone(), world_size, config.mappings_max),
            seq: 0,
            expected: vec![0; world_size],
            op_timeout: config.op_timeout,
            pipeline: pipeline_streams::PipelineStreams::new(
                &gpu,
                world_size,
                rank,
                config.streams_per_peer,
                config.pipeline_chunks_max,
            )?,
            caller: caller_reduce.clone(),
        };
        let (tx, rx) = sync_channel(config.queue_depth);
        let handle = std::thread::Builder::new()
            .name(format!("accord-gpu-{rank}"))
            .spawn(move || worker.run(rx))
            .map_err(|e| GpuCollError::InvalidArgument { what: format!("could not start the progress thread: {e}") })?;
        let marks = marks::StreamMarks::new(&callers_gpu)?;
        tracing::debug!(rank, world_size, gpu = gpu.ordinal(), "GPU communicator ready");
        Ok(GpuCommunicator {
            rank,
            world_size,
            gpu,
            order: config.stream_order,
            config,
            bootstrap: None,
            shared,
            registrations: Mutex::new(registrations),
            vmm_exports,
            callers_gpu,
            scratch,
            stall_gate: Mutex::new(Some(stall_gate)),
            memory_gate,
            caller_reduce,
            direct,
            marks: Some(marks),
            queueing: Mutex::new(()),
            tx: Some(tx),
            worker: Some(handle),
            submitted: AtomicU64::new(0),
        })
    }
}

/// Refuses `stall` in a private context (its kernel belongs to that context and cannot run on a
/// caller's stream, which lives in the primary one), and any order but `waitvalue` with the
/// caller-stream reductions.
pub(super) fn check_order(config: &GpuConfig, order: StreamOrder) -> GpuResult<()> {
    if config.reduce_on_caller && order != StreamOrder::WaitValue {
        return Err(GpuCollError::InvalidArgument {
            what: "ACCORD_GPU_REDUCE_ON_CALLER=1 needs the waitvalue stream order (the reductions queue between \
                   the stream's reached store and its wait for the release)"
                .into(),
        });
    }
    if config.private_context && order == StreamOrder::Stall {
        return Err(GpuCollError::InvalidArgument {
            what: "the stall stream order cannot be used with ACCORD_GPU_PRIVATE_CONTEXT=1 (its kernel would run \
                   on another context's stream); use waitvalue or hostfn"
                .into(),
        });
    }
    Ok(())
}

/// The file descriptors of this rank's VMM registrations, by registration id: open until the
/// registration is dropped, so that peers can take them (`pidfd_getfd`) whenever they first map
/// it.
pub(super) type VmmExports = Mutex<BTreeMap<u64, VmmExport>>;

/// Exports the memory holding `ptr..ptr + len_bytes` and writes it into `rank`'s table on
/// `board` as registration `id`: a CUDA IPC handle for `cuMemAlloc` memory, the mappings'
/// file descriptors for VMM memory (kept in `exports`).
pub(super) fn publish(
    board: &Board,
    rank: usize,
    id: u64,
    gpu: &Gpu,
    (ptr, len_bytes): (DevicePtr, usize),
    exports: &VmmExports,
) -> GpuResult<()> {
    if has_owner_context(ptr)? {
        let (handle, offset) = IpcHandle::export_range(gpu, ptr, len_bytes)?;
        return board.publish_registration(
            rank,
            id,
            &Registered { exported: Exported::Ipc(handle.to_bytes()), offset },
        );
    }
    let export = export_vmm_range(gpu, ptr, len_bytes)?;
    let pieces = export.pieces.iter().map(|p| (p.fd.as_raw_fd(), p.len_bytes)).collect();
    board.publish_registration(rank, id, &Registered { exported: Exported::Vmm(pieces), offset: export.ptr_offset })?;
    exports.lock().unwrap_or_else(|p| p.into_inner()).insert(id, export);
    Ok(())
}
