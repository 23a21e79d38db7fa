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
