use super::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn t(us: u64) -> Instant {
    Instant::from_nanos(us * 1000)
}

#[test]
fn rtt_estimator_tracks_samples() {
    let mut e = RttEstimator::new(Duration::from_micros(100));
    assert!(!e.has_sample());
    e.on_sample(Duration::from_micros(10));
    assert_eq!(e.smoothed(), Duration::from_micros(10));
    for _ in 0..50 {
        e.on_sample(Duration::from_micros(20));
    }
    assert!(e.smoothed() > Duration::from_micros(19));
    assert_eq!(e.min(), Duration::from_micros(10));
}

#[test]
fn timeouts_quarantine_and_probe_revives() {
    let mut table = PathTable::new(4, Duration::from_micros(10));
    let probe = Duration::from_micros(500);
    assert!(!table.on_timeout(t(0), PathId(2), 2, probe));
    assert!(table.on_timeout(t(1), PathId(2), 2, probe));
    assert_eq!(table.active_count(), 3);
    assert_eq!(table.next_probe_at(), Some(t(501)));
    assert_eq!(table.take_due_probe(t(100), probe), None);
    assert_eq!(table.take_due_probe(t(501), probe), Some(PathId(2)));
    assert!(table.on_probe_answered(PathId(2), Duration::from_micros(12)));
    assert_eq!(table.active_count(), 4);
    let stats = table.stats(Duration::from_micros(1), Duration::from_secs(1));
    assert_eq!(stats[2].quarantines, 1);
    assert!(!stats[2].quarantined);
}

#[test]
fn selectors_never_pick_quarantined_paths_while_others_live() {
    let mut table = PathTable::new(8, Duration::from_micros(10));
    for path in [1u16, 3, 5] {
        table.on_timeout(t(0), PathId(path), 1, Duration::from_millis(1));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut p2c = Selector::PowerOfTwo(PowerOfTwoChoices);
    let mut rr = SelectorKind::RoundRobin.build();
    for _ in 0..1000 {
        for s in [&mut p2c, &mut rr] {
            let p = s.select(t(1), &table, &mut rng, Some(PathId(0)));
            assert!(![0u16, 1, 3, 5].contains(&p.0), "picked {p:?}");
        }
    }
}

#[test]
fn all_paths_quarantined_still_selects_some_path() {
    let mut table = PathTable::new(2, Duration::from_micros(10));
    table.on_timeout(t(0), PathId(0), 1, Duration::from_millis(1));
    table.on_timeout(t(0), PathId(1), 1, Duration::from_millis(1));
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let p = PowerOfTwoChoices.select(t(1), &table, &mut rng, None);
    assert!(p.0 < 2);
}

#[test]
fn p2c_prefers_the_faster_path() {
    let mut table = PathTable::new(2, Duration::from_micros(10));
    table.get_mut(PathId(0)).unwrap().rtt.on_sample(Duration::from_micros(50));
    table.get_mut(PathId(1)).unwrap().rtt.on_sample(Duration::from_micros(5));
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for _ in 0..100 {
        assert_eq!(PowerOfTwoChoices.select(t(0), &table, &mut rng, None), PathId(1));
    }
}

#[test]
fn rto_backs_off_within_bounds() {
    let mut table = PathTable::new(1, Duration::from_micros(10));
    let (lo, hi) = (Duration::from_micros(100), Duration::from_millis(1));
    assert_eq!(table.get(PathId(0)).unwrap().rto(lo, hi), lo);
    for _ in 0..20 {
        table.on_timeout(t(0), PathId(0), 100, Duration::from_millis(1));
    }
    assert_eq!(table.get(PathId(0)).unwrap().rto(lo, hi), hi);
    table.on_acked(PathId(0), 0);
    assert_eq!(table.get(PathId(0)).unwrap().rto(lo, hi), lo);
}

#[test]
fn recycling_reuses_clean_paths_in_order_and_avoids_trimmed_ones() {
    let table = PathTable::new(64, Duration::from_micros(10));
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut s = SelectorKind::Recycle.build();
    // Acknowledged without a mark: 5, 9, 17 come back in that order.
    for p in [5, 9, 17] {
        s.on_feedback(PathId(p), true);
    }
    // 9 then lost a packet (a trim NACK): struck out.
    s.on_feedback(PathId(9), false);
    assert_eq!(s.select(t(0), &table, &mut rng, None), PathId(5));
    assert_eq!(s.select(t(0), &table, &mut rng, None), PathId(17));
    // Nothing waits: fresh random paths, never the trimmed one twice in a row by recycling.
    let Selector::Recycle(r) = &s else { panic!("built the recycling selector") };
    assert_eq!((r.recycled_picks, r.waiting()), (2, 0));
    let fresh: Vec<PathId> = (0..200).map(|_| s.select(t(0), &table, &mut rng, None)).collect();
    let distinct: std::collections::BTreeSet<_> = fresh.iter().collect();
    assert!(distinct.len() > 40, "fresh picks spray: {} distinct of 64", distinct.len());
}

#[test]
fn recycling_skips_avoided_and_quarantined_paths_and_stays_bounded() {
    let mut table = PathTable::new(8, Duration::from_micros(10));
    let probe = Duration::from_micros(500);
    assert!(table.on_timeout(t(0), PathId(3), 1, probe));
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut s = Recycling::default();
    for p in [3, 2, 6] {
        s.on_feedback(PathId(p), true);
    }
    // 3 is quarantined and 2 is the path to avoid (a retransmission's lost path): 6 is used.
    assert_eq!(s.select(t(0), &table, &mut rng, Some(PathId(2))), PathId(6));
    for i in 0..(RECYCLE_PATHS_MAX as u16 + 100) {
        s.on_feedback(PathId(i % 8), true);
    }
    assert_eq!(s.waiting(), RECYCLE_PATHS_MAX);
    for _ in 0..1000 {
        let p = s.select(t(0), &table, &mut rng, None);
        assert_ne!(p, PathId(3), "a quarantined path is never picked while others live");
    }
}

#[test]
fn a_spurious_loss_raises_every_paths_floor_within_rto_max_and_it_halves_each_second() {
    let mut table = PathTable::new(3, Duration::from_micros(10));
    let (lo, hi) = (Duration::from_micros(100), Duration::from_millis(50));
    let rto = |table: &PathTable, p: u16| table.rto(PathId(p), lo, hi).unwrap();
    assert_eq!(rto(&table, 2), lo, "no floor before a spurious loss");
    assert!(!table.decay_rto_floor(t(5_000_000)), "nothing to decay");

    // Packet on path 1 sent at 0, acknowledged 8 ms later after being declared lost.
    table.note_spurious_loss(PathId(1));
    assert!(table.raise_rto_floor(t(0), t(8_000), hi));
    assert_eq!(table.rto_floor(), Duration::from_millis(10), "a quarter above the lateness");
    assert!((0..3).all(|p| rto(&table, p) == Duration::from_millis(10)), "every path waits that long");
    assert_eq!(table.stats(lo, hi)[1].spurious_losses, 1);
    // A less late one does not lower it; a later one than rto_max allows is capped.
    assert!(!table.raise_rto_floor(t(10_000), t(12_000), hi));
    assert_eq!(table.rto_floor(), Duration::from_millis(10));
    assert!(table.raise_rto_floor(t(20_000), t(1_020_000), hi));
    assert_eq!(table.rto_floor(), hi);

    // Halves once a second has passed since it last moved, not before; zero ends the decay.
    assert!(!table.decay_rto_floor(t(1_500_000)));
    assert!(table.decay_rto_floor(t(2_020_000)));
    assert_eq!(table.rto_floor(), hi / 2);
    assert!(!table.decay_rto_floor(t(2_500_000)), "a second from the last halving");
    let mut now = 2_020_000;
    while !table.rto_floor().is_zero() {
        now += 1_000_000;
        assert!(table.decay_rto_floor(t(now)));
    }
    assert!(!table.decay_rto_floor(t(now + 10_000_000)));
    assert_eq!(rto(&table, 1), lo);
}
