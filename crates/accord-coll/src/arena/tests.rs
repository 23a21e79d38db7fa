use std::time::{Duration, Instant};

use super::setup::{create_fitting, verdict, Offer, Word};
use super::*;
use crate::{CollTransport, LocalFabric, LocalTransport};

fn ctx<'a>(t: &'a LocalTransport, progress: &'a crate::report::Progress, timeout: Duration) -> Ctx<'a, LocalTransport> {
    Ctx {
        t,
        collective: crate::Collective::AllReduce,
        algo: crate::Algo::Arena,
        seq: 1,
        rank: t.rank(),
        n: t.world_size(),
        deadline: Instant::now() + timeout,
        timeout,
        abort_grace: Duration::from_millis(1),
        progress,
    }
}

fn args(buf: &crate::LocalBuf) -> Args<'_> {
    Args {
        send: buf.all(),
        recv: buf.all(),
        count: 2,
        dtype: crate::DType::F32,
        op: crate::ReduceOp::Sum,
        root: 0,
        scratch: None,
        chunks: 1,
        segment_elems: 1,
        layout: None,
    }
}

#[test]
fn offers_and_words_round_trip_and_garbage_is_refused() {
    let o = Offer { host: "h".into(), pid_ns: 4026531836, shape: Shape { slot_bytes: 1 << 20, lanes: 3 } };
    assert_eq!(Offer::decode(&super::setup::tests_encode_offer(&o)), Some(o));
    assert_eq!(Offer::decode(b"h\n7\n8"), None);
    assert_eq!(Offer::decode(b"h\nseven\n8\n1"), None);
    assert_eq!(Offer::decode(b"h\n7\n8\nfour"), None);
    assert_eq!(Offer::decode(b"h\n7\n8\n1\nextra"), None);
    assert_eq!(Offer::decode(&[0xff, 0xfe]), None);
    let map = Word::Map { path: "/dev/shm/x".into(), token: u128::MAX - 3, lanes: 2 };
    for w in [map, Word::Without("why".into()), Word::Ok] {
        assert_eq!(Word::decode(&super::setup::tests_encode_word(&w)), Some(w));
    }
    assert_eq!(Word::decode(b"map\n/p"), None);
    assert_eq!(Word::decode(b"map\n/p\nnothex\n1"), None);
    assert_eq!(Word::decode(b"map\n/p\nff"), None);
    assert_eq!(Word::decode(b"map\n/p\nff\nmany"), None);
    assert_eq!(Word::decode(b"ok\nmore"), None);
    assert_eq!(Word::decode(b"maybe"), None);
}

#[test]
fn another_host_namespace_or_shape_means_no_arena() {
    let o = |host: &str, pid_ns: u64, slot_bytes: usize| Offer {
        host: host.into(),
        pid_ns,
        shape: Shape::new(slot_bytes, 2),
    };
    assert_eq!(verdict(&[o("a", 1, 64), o("a", 1, 64)]), Ok(()));
    let why = verdict(&[o("a", 1, 64), o("a", 1, 64), o("b", 1, 64)]).unwrap_err();
    assert!(why.contains("rank 2 is on another host"), "{why}");
    let why = verdict(&[o("a", 1, 64), o("a", 2, 64)]).unwrap_err();
    assert!(why.contains("rank 1 is in another pid namespace"), "{why}");
    let why = verdict(&[o("a", 1, 64), o("a", 1, 128)]).unwrap_err();
    assert!(why.contains("rank 1 asks for arena slots of 128 bytes"), "{why}");
    let mut three_lanes = o("a", 1, 64);
    three_lanes.shape.lanes = 3;
    let why = verdict(&[o("a", 1, 64), three_lanes]).unwrap_err();
    assert!(why.contains("rank 1 asks for 3 arena lanes, rank 0 2"), "{why}");
    let none = |host: &str| Offer { host: host.into(), pid_ns: 1, shape: Shape { slot_bytes: 64, lanes: 0 } };
    assert!(verdict(&[none("a"), none("a")]).is_err(), "no lanes is no arena, even if every rank says so");
    assert!(verdict(&[o("", 1, 64), o("", 1, 64)]).is_err(), "an unknown host is no host");
}

/// Every rank of `ts` maps one arena of `shape` through rank 0 (each on a thread of its own).
fn map_arenas(ts: &[LocalTransport], shape: Shape) -> Vec<Arena> {
    let n = ts.len();
    std::thread::scope(|s| {
        let hs: Vec<_> = ts
            .iter()
            .map(|t| {
                s.spawn(move || {
                    let progress = crate::report::Progress::new(t.rank(), n, "c".into(), None);
                    let buf = t.register(vec![0u8; 8]).unwrap();
                    let dir = t.host_memory_dir().unwrap();
                    setup::setup(&ctx(t, &progress, Duration::from_secs(10)), &args(&buf), &dir, shape)
                        .unwrap()
                        .unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Three ranks map one arena through rank 0; its file is gone afterwards and every pid is in
/// it; a wait on a step nobody reached ends at the deadline naming the first rank behind and
/// tells the others.
#[test]
fn ranks_map_one_arena_and_a_wait_names_the_rank_behind() {
    let ts = LocalFabric::create(3).unwrap();
    let arenas = map_arenas(&ts, Shape::new(4096, 2));
    assert!(!arenas[0].map.path().exists(), "the arena file is unlinked once mapped");
    let pids: Vec<u64> = (0..3).map(|r| arenas[1].word(r, PID_WORD).load(Ordering::Acquire)).collect();
    assert_eq!(pids, vec![u64::from(std::process::id()); 3]);
    arenas[2].publish(0, 5);
    arenas[1].publish(1, 5);
    let progress = crate::report::Progress::new(0, 3, "c".into(), None);
    let cx = ctx(&ts[0], &progress, Duration::from_millis(30));
    let buf = ts[0].register(vec![0u8; 8]).unwrap();
    let no = AtomicBool::new(false);
    let Err(LaneStop::Failed(e)) = arenas[0].wait_all(&cx, &args(&buf), 0, 5, &no) else { panic!("the wait ended") };
    assert!(matches!(&e, CollError::Timeout { missing, .. } if missing == &[1]), "{e}");
    assert_eq!(ts[2].stuck_reports(), vec![(0, 1)], "the others are told whom rank 0 waited for");
}

/// Rank 0 waits for rank 1, which reported waiting for rank 2, whose process has exited: rank
/// 0 names rank 2 dead, with its pid, not rank 2 "stopped responding" (CI once saw that).
#[test]
fn a_report_naming_a_rank_whose_process_exited_names_it_dead() {
    let ts = LocalFabric::create(3).unwrap();
    let arenas = map_arenas(&ts, Shape::new(4096, 1));
    let mut child = std::process::Command::new("true").spawn().expect("run `true`");
    let dead = child.id();
    child.wait().unwrap(); // reaped: its pid names no process now
    arenas[0].word(2, PID_WORD).store(u64::from(dead), Ordering::Release);
    arenas[2].publish(0, 5);
    ts[1].report_stuck(2);
    let progress = crate::report::Progress::new(0, 3, "c".into(), None);
    let cx = ctx(&ts[0], &progress, Duration::from_secs(30));
    let buf = ts[0].register(vec![0u8; 8]).unwrap();
    let no = AtomicBool::new(false);
    let Err(LaneStop::Failed(e)) = arenas[0].wait_all(&cx, &args(&buf), 0, 5, &no) else { panic!("the wait ended") };
    assert!(matches!(&e, CollError::PeerDied { rank: 2, .. }), "{e}");
    assert!(e.to_string().contains(&format!("pid {dead} on this host) exited")), "{e}");
}

#[test]
fn slots_are_whole_words_and_the_data_region_starts_on_a_page() {
    assert_eq!(Shape::new(1, 1).slot_bytes, 8);
    assert_eq!(Shape::new(24, 1).slot_bytes, 24);
    assert_eq!(Shape::new(25, 0), Shape { slot_bytes: 32, lanes: 1 });
    for n in [1, 2, 7, 64, 1024] {
        for lanes in [1, 4] {
            let d = data_offset(n, lanes).unwrap();
            assert_eq!(d % 4096, 0);
            assert!(d >= (HEADER_WORDS + lanes * n * RANK_WORDS) * 8);
        }
    }
    assert_eq!(arena_bytes(usize::MAX, Shape::new(8, 1)), None);
    assert_eq!(arena_bytes(4, Shape::new(8, usize::MAX)), None);
    assert_eq!(arena_bytes(2, Shape::new(4096, 3)), Some(4096 + 3 * 3 * 2 * 4096));
}

/// A wait of one lane gives way as soon as another lane of the same rank failed, without
/// waiting for the deadline, and says nothing to the other ranks.
#[test]
fn a_lane_gives_way_when_a_sibling_failed() {
    let ts = LocalFabric::create(2).unwrap();
    let arenas = map_arenas(&ts, Shape::new(64, 2));
    let progress = crate::report::Progress::new(0, 2, "c".into(), None);
    let cx = ctx(&ts[0], &progress, Duration::from_secs(30));
    let buf = ts[0].register(vec![0u8; 8]).unwrap();
    let failed = AtomicBool::new(true);
    let start = Instant::now();
    assert!(matches!(arenas[0].wait_all(&cx, &args(&buf), 1, 1, &failed), Err(LaneStop::Sibling)));
    assert!(start.elapsed() < Duration::from_secs(20), "it gave way long before the deadline");
    assert!(ts[1].stuck_reports().is_empty(), "a lane giving way is not a report");
}

#[test]
fn calls_use_one_more_lane_per_four_slots() {
    let ts = LocalFabric::create(1).unwrap();
    let progress = crate::report::Progress::new(0, 1, "c".into(), None);
    let buf = ts[0].register(vec![0u8; 8]).unwrap();
    let dir = ts[0].host_memory_dir().unwrap();
    let shape = Shape::new(1024, 3);
    let arena =
        setup::setup(&ctx(&ts[0], &progress, Duration::from_secs(10)), &args(&buf), &dir, shape).unwrap().unwrap();
    let lanes: Vec<usize> = [0, 4095, 4096, 8191, 8192, 12288, 1 << 30].iter().map(|&b| arena.lanes_for(b)).collect();
    assert_eq!(lanes, vec![1, 1, 1, 1, 2, 3, 3]);
}

/// A directory without room for every lane keeps the arena with fewer (halved until the file
/// fits), and says which; without room for one lane there is no arena.
#[test]
fn an_arena_without_room_for_every_lane_keeps_fewer() {
    let mut tried = Vec::new();
    let fits_two = |s: Shape| if s.lanes <= 2 { Ok(s.lanes) } else { Err("no room".to_string()) };
    let made = create_fitting(Shape::new(64, 8), |s| {
        tried.push(s.lanes);
        fits_two(s)
    });
    assert_eq!(made, Ok((2, Shape::new(64, 2))));
    assert_eq!(tried, vec![8, 4, 2]);
    let none = create_fitting(Shape::new(64, 3), |_| Err::<(), _>("no room".to_string()));
    assert!(none.unwrap_err().contains("could not create the arena file: no room"));
}
