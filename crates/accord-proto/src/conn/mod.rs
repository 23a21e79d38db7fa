//! One connection: handshake, then a sender and a receiver half sharing the path table.
//!
//! The halves live in sibling files (`sender.rs`, `receiver.rs`) as `impl Connection` blocks;
//! this file holds the state, the handshake and the application-facing calls.

mod credit;
mod receiver;
mod sender;

use crate::admission::ProofKind;
use crate::api::{ConnectionError, ConnectionStats, Event, SendRequest, Transmit, WriteRequest};
use crate::cc::{CongestionControl, Controller};
use crate::config::ConnectionConfig;
use crate::ids::{ConnectionId, OpId, PathId, Psn};
use crate::path::{PathTable, RttEstimator, Selector};
use crate::recv::{InboundOps, ReceiveWindow};
use crate::send::{OpError, OutboundOps, PathDeadlines, SendWindow, SubmitError};
use crate::time::Instant;
use crate::wire::{self, DataKind, Header, HelloRepr, ProbeRepr, Repr};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;

/// Probe answers queued at most; more are dropped (the prober tries again).
const PROBE_REPLIES_MAX: usize = 64;
/// Probes remembered until answered; the oldest is forgotten (its answer then counts as stale,
/// and the prober tries again at the next interval).
const PROBES_OUTSTANDING_MAX: usize = 64;

/// The peer's name for this connection, learnt in the handshake.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Peer {
    pub conn: ConnectionId,
    pub token: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// We sent (or are about to send) a Hello.
    Connecting {
        attempts: u32,
        /// When the first Hello was due: the handshake gives up `handshake_timeout` later.
        since: Instant,
        next_attempt_at: Instant,
        hello_due: bool,
    },
    Established,
    /// Failed or closed; kept until the endpoint reaps it.
    Ended,
}

/// An ACK we owe: which packet triggered it (its path carries the ACK back).
#[derive(Copy, Clone, Debug)]
struct AckDue {
    psn: Psn,
    tx_time_ns: u64,
    path: PathId,
    /// When the triggering packet arrived (for the reported ACK delay).
    received_at: Instant,
    /// When the oldest packet this ACK covers arrived (for the delay deadline).
    first_received_at: Instant,
    /// Send at once rather than at `received_at + ack_delay_max`.
    immediate: bool,
}

/// The chunk being sent: every packet goes on one path.
#[derive(Copy, Clone, Debug)]
struct Chunk {
    path: PathId,
    packets_left: u32,
    retransmission: bool,
}

pub(crate) struct Connection {
    pub(crate) id: ConnectionId,
    state: State,
    config: ConnectionConfig,
    local_token: u64,
    peer: Option<Peer>,
    rng: ChaCha8Rng,
    paths: PathTable,
    selector: Selector,
    cc: Controller,
    rtt: RttEstimator,
    send: SendWindow,
    /// Loss deadline of every path with packets outstanding (kept by `refresh_path_timer`).
    loss_deadlines: PathDeadlines,
    ops: OutboundOps,
    recv: ReceiveWindow,
    inbound: InboundOps,
    ack_due: Option<AckDue>,
    /// Highest packet that asked for an immediate ACK while packets below it were still
    /// missing: the ACK it got could not report the picture it asked for, so the next arrival
    /// that moves the cumulative point past it is acknowledged at once too (a message's last
    /// packet overtaken by an earlier one on another path would otherwise wait for
    /// `ack_delay_max` before its completion is reported).
    ack_request_pending: Option<Psn>,
    packets_since_ack: u16,
    /// New data packets sent since one last asked the receiver to acknowledge at once.
    packets_since_ack_request: u16,
    ecn_ce_received: u32,
    peer_ecn_ce_count: u32,
    chunk: Option<Chunk>,
    /// Start and size of the last chunk sent under pacing (see `paced_until`).
    last_chunk: Option<(Instant, u32)>,
    /// When a chunk blocked by pacing may go (valid while `pacing_blocked`).
    next_send_at: Instant,
    pacing_blocked: bool,
    hello_ack_due: bool,
    probe_replies: VecDeque<(PathId, ProbeRepr)>,
    /// Probes sent and not yet answered, with the path each went out on: only their answers
    /// may revive a path.
    probes_outstanding: VecDeque<(PathId, ProbeRepr)>,
    next_probe_id: u64,
    last_progress: Instant,
    last_ack_at: Option<Instant>,
    close_due: bool,
    stats: ConnectionStats,
    /// Receiver-driven congestion control (EQDS), both halves.
    credit: credit::CreditState,
    /// The sender's state at the moment the connection failed, kept for diagnosis.
    failure_diagnosis: Option<String>,
    /// The job secret the handshake proves (set by the endpoint); `None`: no admission.
    pub(crate) secret: Option<crate::admission::JobSecret>,
    /// Per-connection keys of the authenticated mode, installed by the endpoint once both
    /// sides' tokens are known (see [`crate::wire::mac`]); `None` in the other modes.
    pub(crate) mac: Option<crate::wire::ConnKeys>,
    /// Whether we opened the connection (our Hello): says which key is whose.
    initiated: bool,
}

impl Connection {
    fn new(id: ConnectionId, config: ConnectionConfig, seed: u64, now: Instant) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let local_token = rng.next_u64() | 1;
        let mss = config.mss_bytes();
        Connection {
            id,
            state: State::Ended,
            local_token,
            peer: None,
            rng,
            paths: PathTable::new(config.path_count, config.initial_rtt),
            selector: config.selector.build(),
            cc: config.cc.build(mss),
            rtt: RttEstimator::new(config.initial_rtt),
            send: SendWindow::new(config.path_count),
            loss_deadlines: PathDeadlines::new(config.path_count),
            ops: OutboundOps::new(config.ops_in_flight_max),
            recv: ReceiveWindow::new(config.recv_window_packets),
            inbound: InboundOps::new(config.inbound_ops_max),
            ack_due: None,
            ack_request_pending: None,
            packets_since_ack: 0,
            packets_since_ack_request: 0,
            ecn_ce_received: 0,
            peer_ecn_ce_count: 0,
            chunk: None,
            last_chunk: None,
            next_send_at: Instant::ZERO,
            pacing_blocked: false,
            hello_ack_due: false,
            probe_replies: VecDeque::new(),
            probes_outstanding: VecDeque::new(),
            next_probe_id: 0,
            last_progress: now,
            last_ack_at: None,
            close_due: false,
            stats: ConnectionStats::default(),
            credit: Default::default(),
            failure_diagnosis: None,
            secret: None,
            mac: None,
            initiated: false,
            config,
        }
    }

    /// A connection we open; the Hello goes out on the next `poll_transmit`.
    pub(crate) fn connect(id: ConnectionId, config: ConnectionConfig, seed: u64, now: Instant) -> Self {
        let mut conn = Connection::new(id, config, seed, now);
        conn.initiated = true;
        conn.state = State::Connecting { attempts: 0, since: now, next_attempt_at: now, hello_due: true };
        conn
    }

    /// A connection a peer opened with `hello`; answers with a HelloAck.
    pub(crate) fn accept(
        id: ConnectionId,
        config: ConnectionConfig,
        seed: u64,
        now: Instant,
        hello: &HelloRepr,
    ) -> Self {
        let mut conn = Connection::new(id, config, seed, now);
        conn.adopt_agreement(hello);
        conn.peer = Some(Peer { conn: hello.src_conn, token: hello.src_token });
        conn.state = State::Established;
        conn.hello_ack_due = true;
        conn
    }

    /// Uses the smaller of both sides' datagram size, path count and receive window.
    fn adopt_agreement(&mut self, theirs: &HelloRepr) {
        let c = &mut self.config;
        c.max_datagram_bytes = c.max_datagram_bytes.min(theirs.max_payload_bytes);
        c.path_count = c.path_count.min(theirs.path_count).max(1);
        c.recv_window_packets = c.recv_window_packets.min(theirs.recv_window_packets).max(16);
        self.paths = PathTable::new(c.path_count, c.initial_rtt);
        self.send = SendWindow::new(c.path_count);
        self.loss_deadlines = PathDeadlines::new(c.path_count);
        self.recv = ReceiveWindow::new(c.recv_window_packets);
        self.cc = c.cc.build(c.mss_bytes());
    }

    pub(crate) fn local_token(&self) -> u64 {
        self.local_token
    }

    /// The authenticated mode's keys for this connection, once the peer's token is known.
    pub(crate) fn derive_mac_keys(&self, secret: &crate::admission::JobSecret) -> Option<crate::wire::ConnKeys> {
        let peer = self.peer.as_ref()?;
        let ours = crate::wire::ConnSide { conn: self.id, token: self.local_token };
        let theirs = crate::wire::ConnSide { conn: peer.conn, token: peer.token };
        let (initiator, acceptor) = if self.initiated { (ours, theirs) } else { (theirs, ours) };
        Some(crate::wire::ConnKeys::derive(secret, initiator, acceptor, self.initiated))
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.state == State::Ended
    }

    pub(crate) fn is_established(&self) -> bool {
        self.state == State::Established
    }

    /// Our Hello, as the handshake packets carry it.
    pub(crate) fn hello_repr(&self) -> HelloRepr {
        HelloRepr {
            src_conn: self.id,
            src_token: self.local_token,
            max_payload_bytes: self.config.max_datagram_bytes,
            path_count: self.config.path_count,
            recv_window_packets: self.config.recv_window_packets,
            proof: [0; 16],
        }
    }

    /// Our Hello or HelloAck under `header`, with its proof when the job has a secret.
    fn proven_hello(&self, kind: ProofKind, header: &Header) -> HelloRepr {
        let mut hello = self.hello_repr();
        if let Some(secret) = &self.secret {
            hello.proof = crate::admission::prove(secret, kind, header, &hello);
        }
        hello
    }

    /// The peer answered our Hello. Returns false when the answer lacks the proof of the job
    /// secret (then it changes nothing: the handshake goes on waiting for a real answer).
    pub(crate) fn on_hello_ack(
        &mut self,
        header: &Header,
        hello_ack: &HelloRepr,
        events: &mut VecDeque<Event>,
    ) -> bool {
        if let Some(secret) = &self.secret {
            if !crate::admission::verify(secret, ProofKind::HelloAck, header, hello_ack) {
                return false;
            }
        }
        if !matches!(self.state, State::Connecting { .. }) {
            self.stats.stale_frames += 1; // a duplicate answer
            return true;
        }
        self.adopt_agreement(hello_ack);
        self.peer = Some(Peer { conn: hello_ack.src_conn, token: hello_ack.src_token });
        self.state = State::Established;
        events.push_back(Event::Connected { conn: self.id });
        true
    }

    /// The peer retried its Hello: our HelloAck was lost.
    pub(crate) fn on_duplicate_hello(&mut self) {
        if self.state == State::Established {
            self.hello_ack_due = true;
        }
    }

    pub(crate) fn write(&mut self, req: WriteRequest) -> Result<OpId, SubmitError> {
        self.check_open()?;
        let kind = DataKind::Write { region: req.region, key: req.key, region_offset: req.offset };
        self.ops.submit(kind, req.imm, req.tag, req.len)
    }

    pub(crate) fn send(&mut self, req: SendRequest) -> Result<OpId, SubmitError> {
        self.check_open()?;
        self.ops.submit(DataKind::Send, req.imm, req.tag, req.len)
    }

    fn check_open(&self) -> Result<(), SubmitError> {
        match self.state {
            State::Ended => Err(SubmitError::ConnectionDown),
            _ => Ok(()),
        }
    }

    /// Ends the connection from our side: every operation fails with `Closed`.
    pub(crate) fn close(&mut self, events: &mut VecDeque<Event>) {
        if self.state == State::Ended {
            return;
        }
        self.close_due = self.peer.is_some();
        self.end(OpError::Closed, events);
        events.push_back(Event::Closed { conn: self.id });
    }

    /// The peer closed.
    pub(crate) fn on_close(&mut self, events: &mut VecDeque<Event>) {
        if self.state == State::Ended {
            return;
        }
        self.end(OpError::Closed, events);
        events.push_back(Event::Closed { conn: self.id });
    }

    fn fail(&mut self, error: ConnectionError, events: &mut VecDeque<Event>) {
        self.failure_diagnosis = Some(self.diagnose());
        self.end(OpError::ConnectionLost, events);
        events.push_back(Event::ConnectionFailed { conn: self.id, error });
    }

    fn end(&mut self, op_error: OpError, events: &mut VecDeque<Event>) {
        self.state = State::Ended;
        self.send.clear();
        self.loss_deadlines.clear();
        self.chunk = None;
        for done in self.ops.fail_all(op_error) {
            events.push_back(Event::OpCompleted { conn: self.id, op: done.op, result: done.result });
        }
    }

    /// Handshake retries and failure.
    ///
    /// The budget is time, not a count of retries: a peer that is alive but starved of CPU
    /// (many processes on few cores, one still starting up) may take far longer to answer its
    /// first Hello than the backoff of a few retries adds up to, and failing it then turned an
    /// overloaded start into a failed one. Retries back off from `rto_min` up to `rto_max`.
    fn handle_handshake_timeout(&mut self, now: Instant, events: &mut VecDeque<Event>) {
        let State::Connecting { attempts, since, next_attempt_at, hello_due } = self.state else { return };
        if hello_due || now < next_attempt_at {
            return;
        }
        let waited = now.saturating_duration_since(since);
        if waited >= self.config.handshake_timeout {
            self.fail(ConnectionError::HandshakeTimeout { attempts, waited }, events);
            return;
        }
        self.state = State::Connecting { attempts, since, next_attempt_at, hello_due: true };
    }

    /// Writes the next handshake packet, if one is due.
    fn poll_handshake(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if let State::Connecting { attempts, since, hello_due: true, .. } = self.state {
            let backoff = self.config.rto_min.saturating_mul(1 << attempts.min(10)).min(self.config.rto_max);
            // Never past the handshake's deadline, so the failure is noticed on time.
            let deadline = since + self.config.handshake_timeout;
            let next_attempt_at = (now + backoff).min(deadline.max(now));
            self.state = State::Connecting { attempts: attempts + 1, since, next_attempt_at, hello_due: false };
            let header = Header { dst_conn: ConnectionId(0), token: 0 };
            let hello = self.proven_hello(ProofKind::Hello, &header);
            return self.emit_control(&header, &Repr::Hello(hello), PathId(0), buf);
        }
        if self.hello_ack_due {
            self.hello_ack_due = false;
            let header = self.peer_header()?;
            let hello_ack = self.proven_hello(ProofKind::HelloAck, &header);
            return self.emit_control(&header, &Repr::HelloAck(hello_ack), PathId(0), buf);
        }
        if self.close_due {
            self.close_due = false;
            let header = self.peer_header()?;
            return self.emit_control(&header, &Repr::Close(wire::CloseRepr { reason: 0 }), PathId(0), buf);
        }
        None
    }

    fn peer_header(&self) -> Option<Header> {
        self.peer.map(|p| Header { dst_conn: p.conn, token: p.token })
    }

    /// Emits a packet without payload; `None` if the buffer is too small (a caller bug that
    /// costs a packet, never memory safety).
    fn emit_control(&mut self, header: &Header, repr: &Repr, path: PathId, buf: &mut [u8]) -> Option<Transmit> {
        match wire::emit(header, repr, buf) {
            Ok(header_len) => Some(Transmit {
                conn: self.id,
                path,
                header_len,
                payload: None,
                ecn_capable: false,
                seal: crate::api::PendingSeal::Done,
            }),
            Err(_) => {
                debug_assert!(false, "transmit buffer too small for a control packet");
                None
            }
        }
    }

    /// Next datagram to send, in priority order: handshake, ACK, probe answers, probes, data.
    pub(crate) fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if let Some(t) = self.poll_handshake(now, buf) {
            return Some(t);
        }
        if self.state != State::Established {
            return None;
        }
        if let Some(t) = self.poll_ack(now, buf) {
            return Some(t);
        }
        if let Some(t) = self.poll_credit_control(now, buf) {
            return Some(t);
        }
        if let Some(t) = self.poll_probe(now, buf) {
            return Some(t);
        }
        self.poll_data(now, buf)
    }

    /// Every timer this connection runs.
    pub(crate) fn handle_timeout(&mut self, now: Instant, events: &mut VecDeque<Event>) {
        match self.state {
            State::Connecting { .. } => self.handle_handshake_timeout(now, events),
            State::Established => {
                self.handle_loss_timeouts(now, events);
                self.handle_idle_timeout(now, events);
            }
            State::Ended => {}
        }
    }

    fn handle_idle_timeout(&mut self, now: Instant, events: &mut VecDeque<Event>) {
        if self.send.has_unresolved() && now.saturating_duration_since(self.last_progress) >= self.config.idle_timeout {
            self.fail(ConnectionError::IdleTimeout(self.config.idle_timeout), events);
        }
    }

    /// The earliest instant at which `handle_timeout` has work.
    pub(crate) fn poll_timeout(&mut self) -> Option<Instant> {
        match self.state {
            State::Connecting { next_attempt_at, hello_due: false, .. } => Some(next_attempt_at),
            State::Connecting { .. } | State::Ended => None,
            State::Established => {
                let mut earliest: Option<Instant> = None;
                let mut consider = |t: Option<Instant>| {
                    if let Some(t) = t {
                        earliest = Some(earliest.map_or(t, |e| e.min(t)));
                    }
                };
                consider(self.ack_deadline());
                consider(self.paths.next_probe_at());
                consider(self.pacing_blocked.then_some(self.next_send_at));
                consider(self.earliest_loss_timeout());
                consider(self.rts_deadline());
                if self.send.has_unresolved() {
                    consider(Some(self.last_progress + self.config.idle_timeout));
                }
                earliest
            }
        }
    }

    pub(crate) fn stats(&self) -> ConnectionStats {
        let mut s = self.stats.clone();
        s.cc = self.cc.name();
        s.window_bytes = self.cc.window_bytes();
        s.bytes_in_flight = self.send.bytes_in_flight();
        s.rtt_min = self.rtt.min();
        s.rtt_smoothed = self.rtt.smoothed();
        s.ops_outstanding = self.ops.len() as u64;
        s.paths = self.paths.stats(self.config.rto_min, self.config.rto_max);
        s
    }

    /// Our own invariants, for tests and the simulator: in-flight accounting matches the
    /// packets, and no packet left with the window full.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let counted = self.send.bytes_in_flight();
        let recounted = self.send.recount_bytes_in_flight();
        if counted != recounted {
            return Err(format!("conn {:?}: bytes_in_flight {counted} but packets hold {recounted}", self.id));
        }
        for path in 0..self.paths.len() {
            let path = PathId(path as u16);
            let oldest = self.send.oldest_outstanding_peek(path);
            let rto = self.paths.rto(path, self.config.rto_min, self.config.rto_max);
            let expected = oldest.zip(rto).map(|(sent, rto)| sent + rto);
            if self.loss_deadlines.get(path) != expected && self.state == State::Established {
                return Err(format!(
                    "conn {:?}: path {} loss deadline {:?} but its oldest packet says {expected:?}",
                    self.id,
                    path.0,
                    self.loss_deadlines.get(path)
                ));
            }
            let cached = self.paths.get(path).and_then(|p| p.oldest_outstanding_sent_at);
            if cached != oldest && self.state == State::Established {
                return Err(format!(
                    "conn {:?}: path {} oldest outstanding {cached:?} but packets say {oldest:?}",
                    self.id, path.0
                ));
            }
        }
        if self.stats.window_overruns != 0 {
            return Err(format!("conn {:?}: {} packets sent beyond the window", self.id, self.stats.window_overruns));
        }
        self.cc.check_invariants().map_err(|e| format!("conn {:?}: {e}", self.id))?;
        if self.send.span() > self.config.recv_window_packets as u64 {
            return Err(format!(
                "conn {:?}: {} packet numbers in use, window {}",
                self.id,
                self.send.span(),
                self.config.recv_window_packets
            ));
        }
        Ok(())
    }

    pub(crate) fn diagnose(&self) -> String {
        if let Some(at_failure) = &self.failure_diagnosis {
            return format!("at failure: {at_failure}");
        }
        format!(
            "state {:?} floor {} next_psn {} in_flight {} window {} recv_base {} chunk {:?} ops {} new_data {} ack_due {:?}\nunresolved: {:?}",
            self.state,
            self.send.floor(),
            self.send.next_psn(),
            self.send.bytes_in_flight(),
            self.cc.window_bytes(),
            self.recv.base(),
            self.chunk,
            self.ops.len(),
            self.ops.has_new_data(),
            self.ack_due,
            self.send.unresolved_below(self.send.next_psn()).take(8).map(|psn| (psn, self.send.get(psn).cloned())).collect::<Vec<_>>(),
        )
    }

    pub(crate) fn config(&self) -> &ConnectionConfig {
        &self.config
    }
}
