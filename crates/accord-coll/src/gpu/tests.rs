use std::time::Duration;

use super::board::{
    board_words, entry_of, Board, Deadline, Exported, Registered, Slot, GPU_WORLD_SIZE_MAX, REG_ENTRIES,
    VMM_PIECES_INLINE,
};
use super::config::{GpuConfig, StreamOrder};
use super::plan::{self, Buf, Plan, ReduceShape};
use super::registry::Registrations;
use super::GpuCollError;

fn phase_of(p: &Plan) -> &plan::Phase {
    match p {
        Plan::Copy(phase) => phase,
        Plan::Reduce(_) => panic!("not a copy plan"),
    }
}

/// Every rank's pushes into `dst` match the sources `dst` expects, and cover its receive buffer once.
fn check_copy_plans(n: usize, plans: &[Plan], recv_len: usize, covered_len: usize) {
    for dst in 0..n {
        let mut cover = vec![0u8; recv_len];
        let mut pushers = Vec::new();
        for (src, p) in plans.iter().enumerate() {
            for push in phase_of(p).pushes.iter().filter(|p| p.dst_rank == dst) {
                assert_eq!(push.dst, Buf::Recv);
                for b in &mut cover[push.dst_offset..push.dst_offset + push.len] {
                    *b += 1;
                }
                if src != dst {
                    pushers.push(src);
                }
            }
        }
        pushers.dedup();
        assert_eq!(pushers, phase_of(&plans[dst]).sources, "sources of rank {dst}");
        assert!(cover[..covered_len].iter().all(|&c| c == 1), "rank {dst} coverage");
    }
}

#[test]
fn copy_plans_cover_every_byte_once() {
    for n in 1..=5 {
        let b = 96;
        check_copy_plans(n, &(0..n).map(|r| plan::all_gather(n, r, b)).collect::<Vec<_>>(), n * b, n * b);
        check_copy_plans(n, &(0..n).map(|r| plan::all_to_all(n, r, b)).collect::<Vec<_>>(), n * b, n * b);
        check_copy_plans(n, &(0..n).map(|r| plan::sendrecv(n, r, b)).collect::<Vec<_>>(), b, b);
        for root in 0..n {
            check_copy_plans(n, &(0..n).map(|r| plan::broadcast(n, r, root, b)).collect::<Vec<_>>(), b, b);
        }
    }
}

fn shape(n: usize, me: usize, scratch_bytes: usize, chunk_bytes: usize) -> ReduceShape {
    ReduceShape { n, me, element_bytes: 4, scratch_bytes, chunk_bytes, chunks_max: 5 }
}

#[test]
fn reduce_plans_agree_between_ranks_and_respect_the_scratch() {
    let small = (1..=4).flat_map(|n| {
        [0usize, 1, 7, 1000, 4099].into_iter().flat_map(move |count| {
            [64usize, 4096, 1 << 20].into_iter().flat_map(move |scratch| {
                [4usize, 256, 1 << 20].into_iter().map(move |chunk| (n, count, scratch, chunk))
            })
        })
    });
    // Blocks of several MiB: the ramp of smaller last chunks, in one round and in several.
    let ramped = [(2, 1_500_001, 8 << 20, 1 << 20), (3, 3_000_001, 4 << 20, 1 << 20)];
    for (n, count, scratch, chunk_bytes) in small.chain(ramped) {
        let plans: Vec<_> = (0..n).map(|me| plan::all_reduce(shape(n, me, scratch, chunk_bytes), count)).collect();
        let rounds = plans[0].round_count();
        assert!(plans.iter().all(|p| p.round_count() == rounds), "same round count everywhere");
        let mut reduced = vec![0u32; count];
        let mut gathered = vec![vec![0u32; count]; n];
        for (me, p) in plans.iter().enumerate() {
            let Plan::Reduce(rs) = p else { panic!() };
            for (r, round) in rs.iter().enumerate() {
                let Plan::Reduce(theirs) = &plans[(me + 1) % n] else { panic!() };
                assert_eq!(round.chunks.len(), theirs[r].chunks.len(), "same chunk count everywhere");
                assert!(round.chunks.len() <= 5, "chunks_max respected");
                let mut slot_cover = vec![vec![0u8; scratch]; n];
                for (c, chunk) in round.chunks.iter().enumerate() {
                    for push in &chunk.scatter {
                        assert_eq!(push.dst, Buf::Scratch);
                        assert!(push.dst_offset + push.len <= scratch.max(4), "inside scratch");
                        slot_cover[push.dst_rank][push.dst_offset..push.dst_offset + push.len]
                            .iter_mut()
                            .for_each(|b| *b += 1);
                        // The receiver reduces exactly what arrived in this chunk.
                        let Plan::Reduce(rx) = &plans[push.dst_rank] else { panic!() };
                        let work = rx[r].chunks[c].reduce.as_ref().expect("receiver reduces the chunk");
                        assert!(work.scratch_offsets.contains(&push.dst_offset), "offsets agree");
                        assert_eq!(work.count * 4, push.len, "lengths agree");
                    }
                    if let Some(work) = &chunk.reduce {
                        assert_eq!(work.scratch_offsets.len(), n - 1);
                        let start = work.dst_offset / 4;
                        reduced[start..start + work.count].iter_mut().for_each(|c| *c += 1);
                    }
                    for push in &chunk.gather {
                        assert_eq!((push.src, push.dst), (Buf::Recv, Buf::Recv));
                        let w = chunk.reduce.as_ref().expect("only reduced slices are gathered");
                        assert_eq!((push.src_offset, push.len), (w.dst_offset, w.count * 4));
                        let start = push.dst_offset / 4;
                        gathered[push.dst_rank][start..start + push.len / 4].iter_mut().for_each(|c| *c += 1);
                    }
                }
                assert!(slot_cover.iter().flatten().all(|&b| b <= 1), "no scratch byte written twice");
            }
        }
        assert!(reduced.iter().all(|&c| c == 1), "every element reduced once (n={n} count={count})");
        for (dst, g) in gathered.iter().enumerate() {
            // Every element not reduced at `dst` arrives from its owner exactly once.
            let Plan::Reduce(own) = &plans[dst] else { panic!() };
            let mut mine = vec![0u32; count];
            for chunk in own.iter().flat_map(|r| &r.chunks) {
                if let Some(w) = &chunk.reduce {
                    let start = w.dst_offset / 4;
                    mine[start..start + w.count].iter_mut().for_each(|c| *c += 1);
                }
            }
            assert!(g.iter().zip(&mine).all(|(a, b)| a + b == 1), "rank {dst} receives every element once");
        }
    }
    let rs = plan::reduce_scatter(shape(2, 1, 4096, 1 << 20), 3000);
    assert_eq!(rs.round_count(), 3);
    let Plan::Reduce(rounds) = plan::reduce_scatter(shape(2, 0, 1 << 20, 1000), 3000) else { panic!() };
    assert_eq!(rounds.len(), 1);
    assert_eq!(rounds[0].chunks.len(), 5, "12000 bytes in 1000-byte chunks, capped at 5 (no ramp below 2 MiB)");
    assert!(rounds[0].chunks.iter().all(|c| c.gather.is_empty()), "reduce_scatter gathers nothing");
}

#[test]
fn chunk_weights_ramp_down_and_slices_tile_the_block() {
    assert_eq!(plan::chunk_weights(1 << 20, 4096, 16), vec![1; 16], "small rounds: equal chunks");
    assert_eq!(plan::chunk_weights(32 << 20, 8 << 20, 16), vec![4, 4, 4, 2, 1, 1]);
    assert_eq!(plan::chunk_weights(128 << 20, 8 << 20, 16).len(), 16, "the ramp counts against chunks_max");
    assert_eq!(plan::chunk_weights(4 << 20, 8 << 20, 16), vec![2, 1, 1]);
    for len in [0usize, 1, 5, 999, 1 << 20] {
        for weights in [vec![1u64], vec![4, 4, 2, 1, 1], vec![2, 1, 1]] {
            let mut next = 0;
            for c in 0..weights.len() {
                let (start, n) = plan::weighted_slice(len, &weights, c);
                assert_eq!(start, next, "contiguous");
                next += n;
            }
            assert_eq!(next, len, "covers the block");
        }
    }
}

#[test]
fn chunk_counts_are_bounded() {
    assert_eq!(plan::chunk_count(0, 4096, 16), 1);
    assert_eq!(plan::chunk_count(64 << 20, 4 << 20, 16), 16);
    assert_eq!(plan::chunk_count(32 << 20, 4 << 20, 16), 8);
    assert_eq!(plan::chunk_count(1 << 30, 4 << 20, 16), 16);
    assert_eq!(plan::chunk_count(100, 0, 0), 1);
}

#[test]
fn blocks_split_counts_exactly() {
    for count in 0..50 {
        for n in 1..6 {
            let total: usize = (0..n).map(|i| plan::block_of(count, n, i).1).sum();
            assert_eq!(total, count);
        }
    }
}

#[test]
fn board_signals_between_threads_and_detects_a_closed_peer() {
    let path =
        std::env::temp_dir().join(format!("accord-gpu-test-{}-{:?}", std::process::id(), std::thread::current().id()));
    let _ = std::fs::remove_file(&path);
    let a = Board::create(&path, 2).unwrap();
    a.init_header();
    let b = Board::open(&path, 2).unwrap();
    a.unlink().unwrap();
    assert!(!path.exists(), "unlinked once every rank has it open");
    b.check_header().unwrap();
    a.open_rank(0, std::process::id());
    b.open_rank(1, std::process::id());
    let slot = Slot { seq: 1, recv_reg: 5, recv_offset: 64, scratch_reg: 1 };
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            b.post_ready(1, slot);
            b.signal_done(1, 0);
        });
        a.wait_ready(1, 1, Deadline::after(Duration::from_secs(5))).unwrap();
        assert_eq!(a.read_slot(1, 1).unwrap(), slot);
        a.wait_done(1, 0, 1, Deadline::after(Duration::from_secs(5))).unwrap();
    });
    assert!(matches!(a.read_slot(1, 2), Err(GpuCollError::Protocol { .. })));
    b.close_rank(1);
    let err = a.wait_ready(1, 2, Deadline::after(Duration::from_secs(5))).unwrap_err();
    assert!(matches!(err, GpuCollError::PeerGone { rank: 1, .. }), "{err}");
    let err = a.wait_done(0, 1, 1, Deadline::after(Duration::from_millis(30)));
    assert!(matches!(err, Err(GpuCollError::Timeout { .. })));
}

#[test]
fn a_board_of_another_world_size_or_beyond_the_bounds_is_refused_naming_the_segment() {
    let path = std::env::temp_dir().join(format!(
        "accord-gpu-test-bounds-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_file(&path);
    let a = Board::create(&path, 3).unwrap();
    let err = Board::open(&path, 2).unwrap_err();
    match &err {
        GpuCollError::SharedMemory { path: p, reason } => {
            assert_eq!(p, &path.display().to_string());
            let expected =
                format!("is {} bytes, expected {}; ranks run different builds", board_words(3) * 8, board_words(2) * 8);
            assert_eq!(reason, &expected);
        }
        other => panic!("expected a shared-memory error, got {other}"),
    }
    let err = Board::create(&path, 3).unwrap_err();
    assert!(matches!(&err, GpuCollError::SharedMemory { reason, .. } if reason.starts_with("create:")), "{err}");
    drop(a);
    assert!(!path.exists(), "the creator removes the segment when it goes before unlinking");
    for world in [0, GPU_WORLD_SIZE_MAX + 1] {
        assert!(matches!(Board::create(&path, world), Err(GpuCollError::InvalidArgument { .. })));
        assert!(!path.exists());
    }
}

#[test]
fn registrations_are_bounded_and_found_by_range() {
    let mut regs = Registrations::new(2);
    let a = regs.insert(0x1000, 0x100).unwrap();
    let b = regs.insert(0x4000, 0x100).unwrap();
    assert_ne!(a, b);
    assert!(matches!(regs.insert(0x8000, 1), Err(GpuCollError::TableFull { .. })));
    assert_eq!(regs.lookup(0x1010, 0x10), Some((a, 0x10)));
    assert_eq!(regs.lookup(0x10f0, 0x20), None);
    assert!(regs.remove(a));
    let c = regs.insert(0x1000, 0x100).unwrap();
    assert!(c > b, "ids are never reused");
}

/// A board that two ranks (two mappings in this process) share, unlinked.
fn shared_board(world: usize, name: &str) -> (Board, Board) {
    let path = std::env::temp_dir().join(format!("accord-gpu-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let a = Board::create(&path, world).unwrap();
    a.init_header();
    let b = Board::open(&path, world).unwrap();
    a.unlink().unwrap();
    (a, b)
}

#[test]
fn registrations_travel_through_the_board() {
    let (a, b) = shared_board(3, "regs");
    let mut handle = [0u8; accord_cuda::ipc::IPC_HANDLE_BYTES];
    for (i, byte) in handle.iter_mut().enumerate() {
        *byte = i as u8 ^ 0x5a;
    }
    let reg = Registered { exported: Exported::Ipc(handle), offset: 4096 };
    b.publish_registration(2, 7, &reg).unwrap();
    assert_eq!(a.read_registration(2, 7).unwrap(), reg, "every byte of the handle and the offset arrive");
    let err = a.read_registration(1, 7).unwrap_err();
    assert!(matches!(err, GpuCollError::Protocol { rank: 1, .. }), "another rank's table is separate: {err}");
    // An id sharing the entry replaces the old one, which then reads as missing.
    let later = 7 + REG_ENTRIES as u64;
    assert_eq!(entry_of(later), entry_of(7));
    b.publish_registration(2, later, &Registered { exported: Exported::Ipc(handle), offset: 0 }).unwrap();
    assert!(matches!(a.read_registration(2, 7), Err(GpuCollError::Protocol { rank: 2, .. })));
    assert_eq!(a.read_registration(2, later).unwrap().offset, 0);
    // Clearing only clears the id that is there.
    b.clear_registration(2, 7);
    assert!(a.read_registration(2, later).is_ok());
    b.clear_registration(2, later);
    assert!(a.read_registration(2, later).is_err());
}

#[test]
fn vmm_registrations_travel_through_the_board_with_their_pieces() {
    let (a, b) = shared_board(2, "vmm-regs");
    let pieces: Vec<(i32, u64)> =
        (0..VMM_PIECES_INLINE as i32).map(|i| (100 + i, (20 << 20) + 4096 * i as u64)).collect();
    let reg = Registered { exported: Exported::Vmm(pieces.clone()), offset: 12_345 };
    b.publish_registration(1, 9, &reg).unwrap();
    assert_eq!(a.read_registration(1, 9).unwrap(), reg, "every descriptor, size and the offset arrive");
    // An IPC registration in the same entry afterwards leaves nothing of the pieces behind.
    let ipc = Registered { exported: Exported::Ipc([7; accord_cuda::ipc::IPC_HANDLE_BYTES]), offset: 0 };
    b.publish_registration(1, 9 + REG_ENTRIES as u64, &ipc).unwrap();
    assert_eq!(a.read_registration(1, 9 + REG_ENTRIES as u64).unwrap(), ipc);
}

#[test]
fn vmm_registrations_an_entry_cannot_hold_are_refused_and_nothing_is_written() {
    let (a, b) = shared_board(2, "vmm-refused");
    let good = Registered { exported: Exported::Vmm(vec![(3, 2 << 20)]), offset: 0 };
    b.publish_registration(0, 5, &good).unwrap();
    let refused = [
        Registered { exported: Exported::Vmm(vec![]), offset: 0 },
        Registered { exported: Exported::Vmm(vec![(3, 1 << 20); VMM_PIECES_INLINE + 1]), offset: 0 },
        Registered { exported: Exported::Vmm(vec![(-1, 2 << 20)]), offset: 0 },
        Registered { exported: Exported::Vmm(vec![(3, 4095)]), offset: 0 },
        Registered { exported: Exported::Vmm(vec![(3, 4096 << 32)]), offset: 0 },
    ];
    for reg in &refused {
        let err = b.publish_registration(0, 5 + REG_ENTRIES as u64, reg).unwrap_err();
        assert!(matches!(err, GpuCollError::InvalidArgument { .. }), "{reg:?}: {err}");
        assert_eq!(a.read_registration(0, 5).unwrap(), good, "the entry still holds the earlier registration");
    }
}

#[test]
fn registration_ids_never_share_a_live_board_entry() {
    let mut regs = Registrations::new(REG_ENTRIES);
    let first = regs.insert(0x1000, 1).unwrap();
    for i in 1..REG_ENTRIES as u64 - 1 {
        regs.insert(0x1000 + i * 0x1000, 1).unwrap();
    }
    // Free one early id; the next ids wrap round to entries still in use and must skip them.
    assert!(regs.remove(first + 3));
    let next = regs.insert(0xdead_0000, 1).unwrap();
    let live: Vec<u64> = (0..REG_ENTRIES as u64 * 3).filter(|id| regs.lookup_id(*id).is_some()).collect();
    let mut entries: Vec<usize> = live.iter().map(|id| entry_of(*id)).collect();
    entries.sort_unstable();
    entries.dedup();
    assert_eq!(entries.len(), live.len(), "two live registrations share a board entry: {live:?}");
    assert!(next > first + 3, "ids are never reused");
}

#[test]
fn allocations_registered_by_address_are_evicted_least_recent_first() {
    let mut regs = Registrations::new(3);
    let owned = regs.insert(0x1000, 0x100).unwrap();
    let a = regs.insert_allocation(0x10_000, 0x1000, 11).unwrap();
    let b = regs.insert_allocation(0x20_000, 0x1000, 12).unwrap();
    assert!(regs.is_full());
    regs.touch(a, 5);
    regs.touch(b, 4);
    regs.touch(owned, 1);
    assert_eq!(regs.evictable(3), None, "both allocations still have a collective in flight");
    assert_eq!(regs.evictable(4), Some(b));
    assert_eq!(regs.evictable(9), Some(b), "the least recently used goes first, never a buffer the caller owns");
    assert_eq!(regs.find_allocation(0x10_000).map(|(id, r)| (id, r.buffer_id)), Some((a, Some(11))));
    assert_eq!(regs.find_allocation(0x1000), None, "an owned buffer is not an allocation registered by address");
}

#[test]
fn config_reads_overrides_and_refuses_bad_values() {
    let env = |k: &str| match k {
        "ACCORD_GPU_STREAM_ORDER" => Some("stall".to_string()),
        "ACCORD_GPU_STREAMS_PER_PEER" => Some("2".to_string()),
        "ACCORD_GPU_PIPELINE_CHUNK_BYTES" => Some("1048576".to_string()),
        _ => None,
    };
    let c = GpuConfig::from_lookup(env).unwrap();
    assert_eq!(c.stream_order, StreamOrder::Stall);
    for (text, order) in
        [("waitvalue", StreamOrder::WaitValue), ("wait-value", StreamOrder::WaitValue), ("hostfn", StreamOrder::HostFn)]
    {
        assert_eq!(text.parse::<StreamOrder>(), Ok(order));
        assert_eq!(order.name().parse::<StreamOrder>(), Ok(order), "names parse back");
    }
    assert!("spin".parse::<StreamOrder>().unwrap_err().contains("waitvalue"), "the error lists every mode");
    assert_eq!(c.streams_per_peer, 2);
    assert_eq!(c.pipeline_chunk_bytes, 1 << 20);
    let bad = GpuConfig::from_lookup(|k| (k == "ACCORD_GPU_PIPELINE_CHUNKS_MAX").then(|| "65".to_string()));
    assert!(matches!(bad, Err(GpuCollError::InvalidArgument { .. })));
    let bad = GpuConfig::from_lookup(|k| (k == "ACCORD_GPU_QUEUE_DEPTH").then(|| "0".to_string()));
    assert!(matches!(bad, Err(GpuCollError::InvalidArgument { .. })));
    let over = (super::REGISTRATIONS_MAX_LIMIT + 1).to_string();
    let bad = GpuConfig::from_lookup(|k| (k == "ACCORD_GPU_REGISTRATIONS_MAX").then(|| over.clone()));
    assert!(matches!(bad, Err(GpuCollError::InvalidArgument { .. })), "the board has no entry for more");
}

#[test]
fn reductions_on_the_callers_stream_are_read_and_need_the_waitvalue_order() {
    let c = GpuConfig::from_lookup(|k| (k == "ACCORD_GPU_REDUCE_ON_CALLER").then(|| "1".to_string())).unwrap();
    assert!(c.reduce_on_caller);
    assert!(!GpuConfig::default().reduce_on_caller, "off unless asked for");
    assert!(super::check_order(&c, StreamOrder::WaitValue).is_ok());
    for order in [StreamOrder::HostFn, StreamOrder::Stall] {
        let refused = super::check_order(&c, order).unwrap_err().to_string();
        assert!(refused.contains("waitvalue"), "the refusal names the order it needs: {refused}");
    }
}

#[test]
fn the_reduction_grid_cap_is_read_and_off_by_default() {
    assert_eq!(GpuConfig::default().reduce_blocks_max, 0, "one block per SM unless asked for");
    let c = GpuConfig::from_lookup(|k| (k == "ACCORD_GPU_REDUCE_BLOCKS_MAX").then(|| "24".to_string())).unwrap();
    assert_eq!(c.reduce_blocks_max, 24);
    assert_eq!((c.reduce_blocks(132), GpuConfig::default().reduce_blocks(132)), (24, 132));
    let bad = GpuConfig::from_lookup(|k| (k == "ACCORD_GPU_REDUCE_BLOCKS_MAX").then(|| "-3".to_string()));
    assert!(bad.unwrap_err().to_string().contains("ACCORD_GPU_REDUCE_BLOCKS_MAX"));
}
