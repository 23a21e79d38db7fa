//! Deterministic tests of the built-in policies, driven by synthetic events at a 10 µs RTT.
//! Time is whatever the events say; nothing here reads a clock or asserts on timing.

use super::*;

const MSS: u32 = 4096;
const MSS_F: f64 = MSS as f64;
const RTT: Duration = Duration::from_micros(10);

fn at_us(us: f64) -> Instant {
    Instant::from_nanos((us * 1000.0) as u64)
}

/// An ACK frame acknowledging `packets` full packets with the sender window-limited.
fn ack(now: Instant, packets: u64, window_bytes: u64, rtt_sample: Option<Duration>) -> AckEvent {
    let acked = packets * u64::from(MSS);
    AckEvent {
        now,
        path: PathId(0),
        newly_acked_bytes: acked,
        newly_acked_packets: packets,
        rtt_sample,
        rtt_min: RTT,
        rtt_smoothed: RTT,
        bytes_in_flight: window_bytes.saturating_sub(acked),
        ecn_ce_packets: 0,
        mss_bytes: MSS,
    }
}

fn loss(now: Instant) -> LossEvent {
    LossEvent {
        now,
        path: PathId(0),
        lost_bytes: u64::from(MSS),
        lost_packets: 1,
        bytes_in_flight: 0,
        rtt_smoothed: RTT,
    }
}

fn packets(cc: &impl CongestionControl) -> f64 {
    cc.window_bytes() as f64 / MSS_F
}

/// Drives one RTT of ACKs starting at `start_us`: the window at the start of the round is
/// acknowledged in `frames` equal ACK frames spread over the round.
fn one_round(cc: &mut impl CongestionControl, start_us: f64, frames: u64, rtt_sample: Option<Duration>) {
    let window_packets = (cc.window_bytes() / u64::from(MSS)).max(1);
    let per_frame = window_packets.div_ceil(frames).max(1);
    let mut acked = 0;
    let mut i = 0;
    while acked < window_packets {
        let n = per_frame.min(window_packets - acked);
        let now = at_us(start_us + 10.0 * (i as f64 + 1.0) / frames as f64);
        let w = cc.window_bytes();
        cc.on_ack(&ack(now, n, w, rtt_sample));
        acked += n;
        i += 1;
    }
}

fn cubic_with(initial_window_packets: u32) -> Cubic {
    Cubic::new(CubicConfig { initial_window_packets, ..CubicConfig::default() }, MSS)
}

// ---------------------------------------------------------------- CUBIC

#[test]
fn cubic_defaults_match_the_documented_values() {
    let cfg = CubicConfig::default();
    assert_eq!(cfg.initial_window_packets, 32);
    assert_eq!(cfg.min_window_packets, 2);
    assert_eq!(cfg.beta, 0.7);
    assert_eq!(cfg.c, 0.4);
    assert_eq!(cfg.max_window_bytes, 1 << 30);
    assert!(cfg.ecn_as_loss);
    let cc = Cubic::new(cfg, MSS);
    assert_eq!(cc.window_bytes(), 32 * u64::from(MSS));
    assert_eq!(cc.ssthresh_bytes(), u64::MAX);
    assert!(cc.in_slow_start());
    assert_eq!(cc.pacing_rate_bytes_per_sec(), None);
    assert_eq!(cc.name(), "cubic");
}

#[test]
fn cubic_slow_start_doubles_per_rtt() {
    let mut cc = cubic_with(32);
    one_round(&mut cc, 0.0, 8, Some(RTT));
    assert_eq!(packets(&cc), 64.0);
    one_round(&mut cc, 10.0, 8, Some(RTT));
    assert_eq!(packets(&cc), 128.0);
    assert!(cc.in_slow_start());
}

#[test]
fn cubic_does_not_grow_when_application_limited() {
    let mut cc = cubic_with(32);
    let mut ev = ack(at_us(10.0), 4, cc.window_bytes(), Some(RTT));
    ev.bytes_in_flight = 0; // only 4 of 32 packets were in flight
    cc.on_ack(&ev);
    assert_eq!(packets(&cc), 32.0);
}

#[test]
fn cubic_loss_reduces_by_beta_once_per_rtt() {
    let mut cc = cubic_with(100);
    cc.on_ack(&ack(at_us(1.0), 1, cc.window_bytes(), Some(RTT))); // learn the RTT
    let before = cc.window_bytes() as f64;
    cc.on_loss(&loss(at_us(2.0)));
    let after = cc.window_bytes() as f64;
    assert!((after - 0.7 * before).abs() <= 1.0, "{before} -> {after}");
    assert_eq!(cc.ssthresh_bytes(), cc.window_bytes());
    assert_eq!(cc.w_max_bytes(), before as u64);
    assert!(!cc.in_slow_start());

    // More losses within one smoothed RTT are the same congestion event.
    cc.on_loss(&loss(at_us(5.0)));
    cc.on_loss(&loss(at_us(11.9)));
    assert_eq!(cc.window_bytes() as f64, after);

    // One RTT later a new loss is a new event.
    cc.on_loss(&loss(at_us(12.0)));
    let again = cc.window_bytes() as f64;
    assert!((again - 0.7 * after).abs() <= 1.0, "{after} -> {again}");
}

#[test]
fn cubic_first_loss_ends_slow_start() {
    let mut cc = cubic_with(32);
    one_round(&mut cc, 0.0, 4, Some(RTT));
    cc.on_loss(&loss(at_us(10.5)));
    let reduced = packets(&cc);
    assert!((reduced - 0.7 * 64.0).abs() < 0.01);
    // The next round grows far less than slow start would.
    one_round(&mut cc, 11.0, 4, Some(RTT));
    assert!(packets(&cc) < 1.5 * reduced);
    assert!(packets(&cc) >= reduced);
}

#[test]
fn cubic_regains_w_max_within_k_rtts() {
    let w_max = 1000.0;
    let mut cc = cubic_with(1000);
    cc.on_loss(&loss(at_us(0.0)));
    assert!((packets(&cc) - 700.0).abs() < 0.01);
    // K = cbrt((W_max - beta * W_max) / C) in RTTs.
    let k_expected = (300.0f64 / 0.4).cbrt();
    assert!((cc.k_rtts() - k_expected).abs() < 1e-9, "K = {}", cc.k_rtts());

    let rounds = k_expected.ceil() as u64 + 2;
    for round in 0..rounds {
        one_round(&mut cc, 10.0 * round as f64, 20, Some(RTT));
        let w = packets(&cc);
        if round == 2 {
            // Concave region: still well below the plateau after three rounds.
            assert!(w < 0.97 * w_max, "after 3 rounds: {w}");
            assert!(w > 0.8 * w_max, "after 3 rounds: {w}");
        }
    }
    let w = packets(&cc);
    assert!(w >= 0.97 * w_max && w <= 1.1 * w_max, "after {rounds} rounds: {w}");
}

#[test]
fn cubic_reno_friendly_floor_applies_when_the_curve_is_flat() {
    // With a tiny C the cubic curve barely moves for many RTTs; the Reno estimate must still
    // grow the window by about 3(1 - beta)/(1 + beta) = 0.53 packets per RTT.
    let cfg = CubicConfig { initial_window_packets: 1000, c: 1e-9, ..CubicConfig::default() };
    let mut cc = Cubic::new(cfg, MSS);
    cc.on_loss(&loss(at_us(0.0)));
    for round in 0..20 {
        one_round(&mut cc, 10.0 * round as f64, 10, Some(RTT));
    }
    let w = packets(&cc);
    assert!((709.0..=712.0).contains(&w), "{w}");
}

#[test]
fn cubic_rto_collapses_then_slow_starts_to_ssthresh() {
    let mut cc = cubic_with(100);
    cc.on_rto(at_us(0.0));
    assert_eq!(packets(&cc), 2.0);
    assert_eq!(cc.ssthresh_bytes(), (70.0 * MSS_F) as u64);
    assert_eq!(cc.w_max_bytes(), 100 * u64::from(MSS));
    assert!(cc.in_slow_start());
    // A loss right after the RTO is part of the same event.
    cc.on_loss(&loss(at_us(1.0)));
    assert_eq!(packets(&cc), 2.0);

    // Slow start, one packet per ACK frame, until the threshold: it stops exactly there.
    let mut frames = 0;
    while cc.in_slow_start() {
        frames += 1;
        assert!(frames <= 68, "slow start grows one packet per packet acked");
        cc.on_ack(&ack(at_us(2.0 + 0.1 * frames as f64), 1, cc.window_bytes(), Some(RTT)));
    }
    assert_eq!(frames, 68);
    assert_eq!(packets(&cc), 70.0);
    // Then congestion avoidance climbs back toward the old W_max, not past it at once.
    one_round(&mut cc, 20.0, 2, Some(RTT));
    assert!(packets(&cc) > 70.0 && packets(&cc) < 100.0, "{}", packets(&cc));
}

#[test]
fn cubic_repeated_rto_keeps_the_first_threshold() {
    let mut cc = cubic_with(100);
    cc.on_rto(at_us(0.0));
    cc.on_rto(at_us(100.0)); // backed-off timer, nothing acknowledged in between
    assert_eq!(packets(&cc), 2.0);
    assert_eq!(cc.ssthresh_bytes(), (70.0 * MSS_F) as u64);
    assert_eq!(cc.w_max_bytes(), 100 * u64::from(MSS));
    // Once an ACK got through, a new RTO is a new episode.
    cc.on_ack(&ack(at_us(200.0), 1, cc.window_bytes(), Some(RTT)));
    assert_eq!(packets(&cc), 3.0);
    cc.on_rto(at_us(300.0));
    assert_eq!(packets(&cc), 2.0);
    assert_eq!(cc.ssthresh_bytes(), (2.1 * MSS_F) as u64);
}

#[test]
fn cubic_window_stays_within_bounds() {
    let mut cc = cubic_with(10);
    for i in 0..50 {
        cc.on_loss(&loss(at_us(10.0 * i as f64)));
    }
    assert_eq!(packets(&cc), 2.0);

    let cfg = CubicConfig { max_window_bytes: 100 * u64::from(MSS), ..CubicConfig::default() };
    let mut cc = Cubic::new(cfg, MSS);
    for round in 0..10 {
        one_round(&mut cc, 10.0 * round as f64, 4, Some(RTT));
    }
    assert_eq!(packets(&cc), 100.0);
}

#[test]
fn cubic_ecn_reduces_once_per_rtt() {
    let mut cc = cubic_with(100);
    let mut ev = ack(at_us(1.0), 10, cc.window_bytes(), Some(RTT));
    ev.ecn_ce_packets = 3;
    cc.on_ack(&ev);
    assert!((packets(&cc) - 70.0).abs() < 0.01);
    ev.now = at_us(5.0);
    cc.on_ack(&ev);
    assert!((packets(&cc) - 70.0).abs() < 0.01, "no second reduction within one RTT");
    ev.now = at_us(11.0);
    cc.on_ack(&ev);
    assert!((packets(&cc) - 49.0).abs() < 0.01);
}

#[test]
fn cubic_ecn_ignored_when_disabled() {
    let cfg = CubicConfig { initial_window_packets: 100, ecn_as_loss: false, ..CubicConfig::default() };
    let mut cc = Cubic::new(cfg, MSS);
    let mut ev = ack(at_us(1.0), 10, cc.window_bytes(), Some(RTT));
    ev.ecn_ce_packets = 10;
    cc.on_ack(&ev);
    assert_eq!(packets(&cc), 110.0, "treated as a plain slow-start ACK");
}

// ---------------------------------------------------------------- Swift

fn swift() -> Swift {
    Swift::new(SwiftConfig::default(), MSS)
}

#[test]
fn swift_defaults_and_target_delay() {
    let cfg = SwiftConfig::default();
    assert_eq!(cfg.base_target_delay, Duration::from_micros(25));
    assert_eq!(cfg.hops, 2);
    let cc = swift();
    assert_eq!(cc.name(), "swift");
    assert_eq!(cc.window_packets(), 32.0);
    assert_eq!(cc.pacing_rate_bytes_per_sec(), None);
    // Flow scaling at 32 packets: between nothing (>= 100 packets) and the full 50 µs range.
    let t = cc.target_delay();
    assert!(t > Duration::from_micros(27) && t < Duration::from_micros(77), "{t:?}");

    let big = Swift::new(SwiftConfig { initial_window_packets: 200.0, ..cfg.clone() }, MSS);
    assert_eq!(big.target_delay(), Duration::from_micros(27));
    let tiny = Swift::new(SwiftConfig { initial_window_packets: 0.05, ..cfg.clone() }, MSS);
    assert_eq!(tiny.target_delay(), Duration::from_micros(77));
    let at_fs_min = Swift::new(SwiftConfig { initial_window_packets: 0.1, ..cfg }, MSS);
    let diff = at_fs_min.target_delay().abs_diff(Duration::from_micros(77));
    assert!(diff <= Duration::from_nanos(1), "{:?}", at_fs_min.target_delay());
}

#[test]
fn swift_grows_by_one_packet_per_rtt_under_target() {
    let mut cc = swift();
    one_round(&mut cc, 0.0, 32, Some(RTT));
    assert!((cc.window_packets() - 33.0).abs() < 0.05, "{}", cc.window_packets());
    // Without an RTT sample there is nothing to judge by: increase only.
    let w = cc.window_packets();
    cc.on_ack(&ack(at_us(20.0), 4, cc.window_bytes(), None));
    assert!(cc.window_packets() > w);
}

#[test]
fn swift_shrinks_over_target_in_proportion_once_per_rtt() {
    let mut cc = Swift::new(SwiftConfig { initial_window_packets: 200.0, ..Default::default() }, MSS);
    let target = cc.target_delay();
    assert_eq!(target, Duration::from_micros(27));
    // Delay 2x target: factor 1 - 0.8 * (54 - 27) / 54 = 0.6.
    cc.on_ack(&ack(at_us(1.0), 1, cc.window_bytes(), Some(2 * target)));
    assert!((cc.window_packets() - 120.0).abs() < 1e-9, "{}", cc.window_packets());
    cc.on_ack(&ack(at_us(5.0), 1, cc.window_bytes(), Some(2 * target)));
    assert!((cc.window_packets() - 120.0).abs() < 1e-9, "at most one decrease per RTT");
    // A slight overshoot a round later gives a slight decrease.
    let w = cc.window_packets();
    let delay = target + Duration::from_micros(3); // 30 µs, target still 27 µs at 120 packets
    cc.on_ack(&ack(at_us(11.0), 1, cc.window_bytes(), Some(delay)));
    let expected = w * (1.0 - 0.8 * 3.0 / 30.0);
    assert!((cc.window_packets() - expected).abs() < 1e-9, "{}", cc.window_packets());
}

#[test]
fn swift_caps_decrease_at_max_mdf() {
    let mut cc = Swift::new(SwiftConfig { initial_window_packets: 200.0, ..Default::default() }, MSS);
    cc.on_ack(&ack(at_us(1.0), 1, cc.window_bytes(), Some(Duration::from_millis(10))));
    assert!((cc.window_packets() - 100.0).abs() < 1e-9, "{}", cc.window_packets());
}

#[test]
fn swift_loss_halves_once_per_rtt_and_rto_goes_to_min() {
    let mut cc = swift();
    cc.on_loss(&loss(at_us(1.0)));
    assert_eq!(cc.window_packets(), 16.0);
    cc.on_loss(&loss(at_us(2.0)));
    assert_eq!(cc.window_packets(), 16.0);
    cc.on_loss(&loss(at_us(11.0)));
    assert_eq!(cc.window_packets(), 8.0);
    cc.on_rto(at_us(12.0));
    assert_eq!(cc.window_packets(), 0.01);
}

#[test]
fn swift_paces_below_one_packet() {
    // The paper's loss rule, so that losses below target still cut (checked further down).
    let cfg = SwiftConfig { initial_window_packets: 0.5, loss_needs_delay: false, ..Default::default() };
    let mut cc = Swift::new(cfg, MSS);
    cc.on_ack(&ack(at_us(1.0), 0, 0, None)); // learns the 10 µs smoothed RTT, acks nothing
    assert_eq!(cc.window_packets(), 0.5);
    // The window is never reported below one packet; pacing carries the fraction.
    assert_eq!(cc.window_bytes(), u64::from(MSS));
    let rate = cc.pacing_rate_bytes_per_sec().expect("paced below one packet");
    assert_eq!(rate, (0.5 * MSS_F / 10e-6) as u64);

    // Below one packet, additive increase is not divided by the window.
    cc.on_ack(&ack(at_us(20.0), 1, cc.window_bytes(), Some(RTT)));
    assert!((cc.window_packets() - 1.5).abs() < 1e-9, "{}", cc.window_packets());
    assert_eq!(cc.pacing_rate_bytes_per_sec(), None);

    // Repeated losses push it down to the fractional minimum, still paced.
    for i in 0..20 {
        cc.on_loss(&loss(at_us(30.0 + 10.0 * i as f64)));
    }
    assert_eq!(cc.window_packets(), 0.01);
    assert_eq!(cc.pacing_rate_bytes_per_sec(), Some((0.01 * MSS_F / 10e-6) as u64));
}

#[test]
fn swift_window_capped_at_max() {
    let cfg = SwiftConfig { initial_window_packets: 10.0, max_window_bytes: 10 * u64::from(MSS), ..Default::default() };
    let mut cc = Swift::new(cfg, MSS);
    one_round(&mut cc, 0.0, 2, Some(RTT));
    assert_eq!(cc.window_packets(), 10.0);
}

// ---------------------------------------------------------------- Fixed, selection, dispatch

#[test]
fn fixed_window_is_constant() {
    let mut cc = FixedWindow::new(1 << 20);
    cc.on_loss(&loss(at_us(1.0)));
    cc.on_rto(at_us(2.0));
    cc.on_ack(&ack(at_us(3.0), 10, 1 << 20, Some(RTT)));
    assert_eq!(cc.window_bytes(), 1 << 20);
    assert_eq!(cc.pacing_rate_bytes_per_sec(), None);
    assert_eq!(FixedWindow::default().window_bytes(), FixedWindow::DEFAULT_WINDOW_BYTES);
    assert_eq!(FixedWindow::DEFAULT_WINDOW_BYTES, 4 * 1024 * 1024);
}

#[test]
fn cc_kind_from_name_is_case_insensitive_and_rejects_others() {
    assert_eq!(CcKind::from_name("cubic"), Ok(CcKind::Cubic(CubicConfig::default())));
    assert_eq!(CcKind::from_name("CUBIC"), Ok(CcKind::Cubic(CubicConfig::default())));
    assert_eq!(CcKind::from_name("Swift"), Ok(CcKind::Swift(SwiftConfig::default())));
    assert_eq!(CcKind::from_name("EQDS"), Ok(CcKind::Eqds(EqdsConfig::default())));
    assert_eq!(CcKind::from_name("eqds").unwrap().build(4096).name(), "eqds");
    assert_eq!(CcKind::from_name(" fixed "), Ok(CcKind::Fixed { window_bytes: FixedWindow::DEFAULT_WINDOW_BYTES }));
    for bad in ["reno", "", "cubic2", "eqds2"] {
        let err = CcKind::from_name(bad).unwrap_err();
        assert_eq!(err.name, bad);
        assert!(err.to_string().contains("cubic, swift, eqds, fixed"));
    }
}

#[test]
fn cc_kind_builds_the_named_controller() {
    for (name, window) in
        [("cubic", 32 * u64::from(MSS)), ("swift", 32 * u64::from(MSS)), ("fixed", FixedWindow::DEFAULT_WINDOW_BYTES)]
    {
        let c = CcKind::from_name(name).unwrap().build(MSS);
        assert_eq!(c.name(), name);
        assert_eq!(c.window_bytes(), window);
    }
    let mut c = CcKind::from_name("cubic").unwrap().build(MSS);
    c.on_loss(&loss(at_us(1.0)));
    assert!(c.window_bytes() < 32 * u64::from(MSS), "dispatch reaches the built-in");
}

/// A user policy: counts what it is told and derives its window from it.
#[derive(Debug, Default)]
struct CountingPolicy {
    acked_bytes: u64,
    losses: u64,
    rtos: u64,
    credit_bytes: u64,
    received: u64,
    retransmissions_received: u64,
}

impl CongestionControl for CountingPolicy {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn window_bytes(&self) -> u64 {
        self.acked_bytes + self.credit_bytes + 1000 * (self.losses + self.rtos)
    }
    fn pacing_rate_bytes_per_sec(&self) -> Option<u64> {
        Some(self.received * 100 + self.retransmissions_received)
    }
    fn chunk_bytes(&self, default_bytes: u32) -> u32 {
        default_bytes / 2
    }
    fn on_ack(&mut self, event: &AckEvent) {
        self.acked_bytes += event.newly_acked_bytes;
    }
    fn on_loss(&mut self, _event: &LossEvent) {
        self.losses += 1;
    }
    fn on_rto(&mut self, _now: Instant) {
        self.rtos += 1;
    }
    fn may_retransmit(&self, _now: Instant, path: PathId) -> RetransmitDecision {
        if path.0 == 0 {
            RetransmitDecision::Later
        } else {
            RetransmitDecision::Now
        }
    }
    fn on_credit(&mut self, _now: Instant, credit_bytes: u64) {
        self.credit_bytes += credit_bytes;
    }
    fn on_data_received(&mut self, _event: &RxDataEvent) {
        self.received += 1;
    }
    fn on_retransmission_received(&mut self, _event: &RxDataEvent) {
        self.retransmissions_received += 1;
    }
}

#[test]
fn controller_dispatches_to_a_custom_policy() {
    let mut c = Controller::Custom(Box::new(CountingPolicy::default()));
    assert_eq!(c.name(), "counting");
    assert_eq!(c.chunk_bytes(32768), 16384);
    c.on_ack(&ack(at_us(1.0), 1, 0, None));
    assert_eq!(c.window_bytes(), u64::from(MSS));
    c.on_loss(&loss(at_us(2.0)));
    c.on_rto(at_us(3.0));
    c.on_credit(at_us(4.0), 7);
    assert_eq!(c.window_bytes(), u64::from(MSS) + 2000 + 7);
    let rx = RxDataEvent { now: at_us(5.0), path: PathId(1), payload_bytes: MSS, ecn_ce: false };
    c.on_data_received(&rx);
    c.on_data_received(&rx);
    c.on_retransmission_received(&rx);
    assert_eq!(c.pacing_rate_bytes_per_sec(), Some(201));
    assert_eq!(c.may_retransmit(at_us(6.0), PathId(0)), RetransmitDecision::Later);
    assert_eq!(c.may_retransmit(at_us(6.0), PathId(1)), RetransmitDecision::Now);
}

#[test]
fn builtins_use_the_trait_defaults_for_unused_hooks() {
    let c = CcKind::from_name("swift").unwrap().build(MSS);
    assert_eq!(c.chunk_bytes(32768), 32768);
    assert_eq!(c.may_retransmit(at_us(0.0), PathId(3)), RetransmitDecision::Now);
}

#[test]
fn swift_ignores_loss_while_delay_is_under_target_unless_configured() {
    let under_target = Some(Duration::from_micros(12));
    let mut cc = swift();
    cc.on_ack(&ack(at_us(1.0), 1, cc.window_bytes(), under_target));
    let before = cc.window_packets();
    cc.on_loss(&loss(at_us(2.0)));
    assert_eq!(cc.window_packets(), before, "random loss with short queues is not congestion");

    let mut paper = Swift::new(SwiftConfig { loss_needs_delay: false, ..Default::default() }, MSS);
    paper.on_ack(&ack(at_us(1.0), 1, paper.window_bytes(), under_target));
    let before = paper.window_packets();
    paper.on_loss(&loss(at_us(2.0)));
    assert!((paper.window_packets() - before * 0.5).abs() < 1e-9, "the paper's rule cuts on every loss");

    // Over target, a loss is congestion: the window is cut (once per RTT).
    let mut congested = swift();
    congested.on_ack(&ack(at_us(1.0), 1, congested.window_bytes(), Some(Duration::from_micros(200))));
    let before = congested.window_packets();
    congested.on_loss(&loss(at_us(20.0)));
    assert!(congested.window_packets() < before);
}
