//! An endpoint: the connections of one local transport instance, their handshake and demux.
//!
//! Everything the outside sees goes through here: datagrams in, transmits out, timers, events,
//! and the application calls on a connection handle. Iteration is over ordered maps only, so
//! the same inputs give the same outputs (the simulator depends on it).

use crate::api::{
    ConnectionHandle, ConnectionStats, DatagramOutcome, EndpointStats, Event, LocalMemory, RxMeta, SendRequest,
    Transmit, WriteRequest,
};
use crate::config::{ConfigError, EndpointConfig};
use crate::conn::Connection;
use crate::credit::{CreditPacer, PacerStats};
use crate::ids::{ConnectionId, OpId};
use crate::send::SubmitError;
use crate::time::Instant;
use crate::wire::{self, HelloRepr, Repr};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, VecDeque};

/// Why `connect` failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    #[error("endpoint already holds {0} connections: close some, or raise connections_max")]
    TooManyConnections(u32),
}

/// The sans-IO endpoint. See [`crate::api`] for the driver loop.
pub struct Endpoint {
    config: EndpointConfig,
    rng: ChaCha8Rng,
    conns: BTreeMap<ConnectionId, Connection>,
    /// Accepted connections by the peer's (connection id, token), to answer repeated Hellos.
    accepted: BTreeMap<(ConnectionId, u64), ConnectionId>,
    next_id: u32,
    /// Connection after which `poll_transmit` looks first (round robin).
    transmit_cursor: ConnectionId,
    events: VecDeque<Event>,
    stats: EndpointStats,
    /// Credit pacer of this NIC for receiver-driven senders (idle unless one connects).
    pacer: CreditPacer,
    /// Key of the handshake packets in the authenticated mode (`None` in the others).
    handshake_key: Option<wire::MacKey>,
}

impl Endpoint {
    /// An endpoint whose every random choice (tokens, path picks) derives from `seed`.
    pub fn new(mut config: EndpointConfig, seed: u64) -> Result<Self, ConfigError> {
        config.connection.validate()?;
        config.credit.validate()?;
        let handshake_key = match (config.integrity, &config.secret) {
            (wire::Integrity::Mac, None) => return Err(ConfigError::MacWithoutSecret),
            (wire::Integrity::Mac, Some(secret)) => {
                // The tag trailer comes out of the datagram budget, so packets still fit it.
                let c = &mut config.connection;
                c.max_datagram_bytes = c.max_datagram_bytes.saturating_sub(wire::MAC_TAG_LEN as u16);
                c.validate()?;
                Some(wire::MacKey::handshake(secret))
            }
            _ => None,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // Connection ids start at a random point so a restarted peer's stale packets miss.
        let next_id = (rng.next_u32() >> 8).max(1);
        Ok(Endpoint {
            pacer: CreditPacer::new(config.credit.clone(), config.connection.mss_bytes()),
            config,
            rng,
            conns: BTreeMap::new(),
            accepted: BTreeMap::new(),
            next_id,
            transmit_cursor: ConnectionId(0),
            events: VecDeque::new(),
            stats: EndpointStats::default(),
            handshake_key,
        })
    }

    pub fn config(&self) -> &EndpointConfig {
        &self.config
    }

    /// The largest datagram this endpoint emits: its connections' datagram size plus the
    /// integrity mode's trailer (which [`Endpoint::new`] took out of the size it was given,
    /// so this is that size again). Transmit buffers need this much.
    pub fn datagram_len_max(&self) -> usize {
        usize::from(self.config.connection.max_datagram_bytes) + self.config.integrity.trailer_len()
    }

    fn allocate_id(&mut self) -> ConnectionId {
        loop {
            let id = ConnectionId(self.next_id);
            self.next_id = self.next_id.wrapping_add(1).max(1);
            if !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    /// Opens a connection; the handshake starts on the next `poll_transmit`. Operations may be
    /// submitted at once and go out when the peer answers.
    pub fn connect(&mut self, now: Instant) -> Result<ConnectionHandle, ConnectError> {
        if self.conns.len() >= self.config.connections_max as usize {
            return Err(ConnectError::TooManyConnections(self.config.connections_max));
        }
        let id = self.allocate_id();
        let seed = self.rng.next_u64();
        let mut conn = Connection::connect(id, self.config.connection.clone(), seed, now);
        conn.secret = self.config.secret;
        self.conns.insert(id, conn);
        Ok(id)
    }

    /// One datagram from the datapath. Never panics on any input; what cannot be attributed is
    /// counted in [`EndpointStats`]. Perform the returned placement before polling events.
    pub fn handle_datagram<M: LocalMemory + ?Sized>(
        &mut self,
        now: Instant,
        rx: RxMeta,
        datagram: &[u8],
        memory: &mut M,
    ) -> DatagramOutcome {
        self.stats.datagrams_received += 1;
        // The end-to-end check first: nothing of a corrupted or forged datagram is read.
        let Some(checked) = self.admit(datagram) else {
            return DatagramOutcome::default();
        };
        self.handle_checked(now, rx, checked, memory)
    }

    /// [`handle_datagram`](Self::handle_datagram) for a datagram that came through a
    /// shared-memory ring of this job (files of mode 0600 that only the job's processes map),
    /// not a network. It accepts this endpoint's own seal, or a CRC of the header alone
    /// (what senders use on a ring: [`Transmit::for_local_channel`]), which a datagram from a
    /// network never may. `payload_present`: whether `datagram` holds the whole datagram;
    /// false when the payload was lent in place (not copied, so not in `datagram`): then a
    /// seal over the payload cannot be checked and the ring vouches for it (counted in
    /// `local_unverified`).
    pub fn handle_local_datagram<M: LocalMemory + ?Sized>(
        &mut self,
        now: Instant,
        rx: RxMeta,
        datagram: &[u8],
        payload_present: bool,
        memory: &mut M,
    ) -> DatagramOutcome {
        self.stats.datagrams_received += 1;
        let Some(&sent_mode) = datagram.get(wire::field::INTEGRITY) else {
            self.stats.malformed += 1;
            return DatagramOutcome::default();
        };
        let own = self.config.integrity;
        let checked = if sent_mode == wire::Integrity::Header.to_u8() {
            self.check_crc(datagram, wire::Integrity::Header).then_some(datagram)
        } else if payload_present || sent_mode != own.to_u8() || !own.covers_payload() {
            self.admit(datagram)
        } else {
            self.stats.local_unverified += 1;
            datagram.get(..datagram.len().saturating_sub(own.trailer_len()))
        };
        let Some(checked) = checked else {
            return DatagramOutcome::default();
        };
        self.handle_checked(now, rx, checked, memory)
    }

    /// Checks `datagram` against this endpoint's own mode; the bytes the parser may read (the
    /// datagram without a MAC trailer), or `None` after counting why not.
    fn admit<'d>(&mut self, datagram: &'d [u8]) -> Option<&'d [u8]> {
        match self.config.integrity {
            wire::Integrity::Mac => self.authenticate(datagram),
            mode => self.check_crc(datagram, mode).then_some(datagram),
        }
    }

    /// Whether `datagram` passes the CRC check of `mode`; counts why not.
    fn check_crc(&mut self, datagram: &[u8], mode: wire::Integrity) -> bool {
        match wire::verify(datagram, mode) {
            Ok(()) => return true,
            Err(wire::WireError::BadChecksum) => self.stats.bad_checksum += 1,
            Err(wire::WireError::IntegrityModeMismatch { .. }) => self.stats.integrity_mismatch += 1,
            Err(_) => self.stats.malformed += 1,
        }
        false
    }

    /// The authenticated mode's check: the tag under the handshake key (Hello, HelloAck) or
    /// the addressed connection's receive key (everything else). Only the type byte and
    /// `dst_conn` are read before it passes, to choose the key; nothing changes.
    fn authenticate<'d>(&mut self, datagram: &'d [u8]) -> Option<&'d [u8]> {
        let Ok((packet_type, header)) = wire::peek(datagram) else {
            self.stats.malformed += 1;
            return None;
        };
        let key = match packet_type {
            wire::PacketType::Hello | wire::PacketType::HelloAck => self.handshake_key.as_ref(),
            _ => match self.conns.get(&header.dst_conn) {
                Some(conn) => conn.mac.as_ref().map(|keys| &keys.rx),
                None => {
                    self.stats.unknown_connection += 1;
                    return None;
                }
            },
        };
        let Some(key) = key else {
            // A connection whose peer is not known yet has no key: nothing can be proven to it.
            self.stats.bad_tag += 1;
            return None;
        };
        match wire::verify_mac(datagram, key) {
            Ok(len) => Some(&datagram[..len]),
            Err(wire::WireError::BadTag) => {
                self.stats.bad_tag += 1;
                None
            }
            Err(wire::WireError::IntegrityModeMismatch { .. }) => {
                self.stats.integrity_mismatch += 1;
                None
            }
            Err(_) => {
                self.stats.malformed += 1;
                None
            }
        }
    }

    fn handle_checked<M: LocalMemory + ?Sized>(
        &mut self,
        now: Instant,
        rx: RxMeta,
        datagram: &[u8],
        memory: &mut M,
    ) -> DatagramOutcome {
        let parsed = match wire::parse(datagram) {
            Ok(p) => p,
            Err(_) => {
                self.stats.malformed += 1;
                return DatagramOutcome::default();
            }
        };
        if let Repr::Hello(hello) = &parsed.repr {
            return self.handle_hello(now, &parsed.header, hello);
        }
        let Some(conn) = self.conns.get_mut(&parsed.header.dst_conn) else {
            self.stats.unknown_connection += 1;
            return DatagramOutcome::default();
        };
        if conn.local_token() != parsed.header.token {
            self.stats.bad_token += 1;
            return DatagramOutcome::default();
        }
        let id = conn.id;
        let events = &mut self.events;
        let placement = match &parsed.repr {
            Repr::Hello(_) => None,
            Repr::HelloAck(hello_ack) => {
                if !conn.on_hello_ack(&parsed.header, hello_ack, events) {
                    self.stats.unadmitted += 1;
                } else if conn.mac.is_none() && self.handshake_key.is_some() {
                    conn.mac = self.config.secret.as_ref().and_then(|secret| conn.derive_mac_keys(secret));
                }
                None
            }
            Repr::Data(data) => conn.handle_data(now, rx, data, parsed.payload.clone(), memory, events),
            Repr::Ack(ack) => {
                conn.handle_ack(now, rx, ack, events);
                None
            }
            Repr::Probe(probe) => {
                conn.handle_probe(rx, probe);
                None
            }
            Repr::ProbeAck(probe) => {
                conn.handle_probe_ack(now, rx, probe, events);
                None
            }
            Repr::Close(_) => {
                conn.on_close(events);
                None
            }
            Repr::Credit(credit) => {
                conn.handle_credit(now, credit, events);
                None
            }
            Repr::Rts(rts) => {
                conn.handle_rts(rts);
                None
            }
        };
        conn.drain_credit_requests(&mut self.pacer);
        DatagramOutcome { conn: Some(id), placement }
    }

    /// A data packet whose payload a switch trimmed (header only, `payload_len` still naming
    /// the bytes cut). Only a datapath that knows the fabric trimmed it may call this: the
    /// simulator does; a socket cannot tell a trimmed packet from a truncated one and must use
    /// [`handle_datagram`](Self::handle_datagram), which drops it. Nothing is ever placed; the
    /// receiver NACKs the packet so the sender resends it at once. The end-to-end check is not
    /// run (the payload it may cover is gone): the calling datapath vouches for the header.
    pub fn handle_trimmed_datagram(&mut self, rx: RxMeta, datagram: &[u8]) -> DatagramOutcome {
        self.stats.datagrams_received += 1;
        let Ok((header, data)) = wire::parse_trimmed(datagram) else {
            self.stats.malformed += 1;
            return DatagramOutcome::default();
        };
        let Some(conn) = self.conns.get_mut(&header.dst_conn) else {
            self.stats.unknown_connection += 1;
            return DatagramOutcome::default();
        };
        if conn.local_token() != header.token {
            self.stats.bad_token += 1;
            return DatagramOutcome::default();
        }
        conn.handle_trimmed(rx, &data);
        conn.drain_credit_requests(&mut self.pacer);
        DatagramOutcome { conn: Some(conn.id), placement: None }
    }

    fn handle_hello(&mut self, now: Instant, header: &wire::Header, hello: &HelloRepr) -> DatagramOutcome {
        // Admission first, before any lookup or allocation: an unproven Hello costs nothing.
        if let Some(secret) = &self.config.secret {
            if !crate::admission::verify(secret, crate::admission::ProofKind::Hello, header, hello) {
                self.stats.unadmitted += 1;
                return DatagramOutcome::default();
            }
        }
        let key = (hello.src_conn, hello.src_token);
        if let Some(&id) = self.accepted.get(&key) {
            if let Some(conn) = self.conns.get_mut(&id) {
                conn.on_duplicate_hello();
                return DatagramOutcome { conn: Some(id), placement: None };
            }
        }
        if hello.path_count == 0 || (hello.max_payload_bytes as usize) < wire::MAX_ACK_LEN {
            self.stats.malformed += 1;
            return DatagramOutcome::default();
        }
        if self.conns.len() >= self.config.connections_max as usize {
            self.stats.connections_refused += 1;
            return DatagramOutcome::default();
        }
        let id = self.allocate_id();
        let seed = self.rng.next_u64();
        let mut conn = Connection::accept(id, self.config.connection.clone(), seed, now, hello);
        conn.secret = self.config.secret;
        if self.handshake_key.is_some() {
            conn.mac = self.config.secret.as_ref().and_then(|secret| conn.derive_mac_keys(secret));
        }
        self.conns.insert(id, conn);
        self.accepted.insert(key, id);
        self.events.push_back(Event::Accepted { conn: id });
        DatagramOutcome { conn: Some(id), placement: None }
    }

    /// Timers: call at (or after) the instant [`poll_timeout`](Self::poll_timeout) gave.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Ended connections stay readable (stats, diagnostics) until the next timer pass.
        self.reap();
        for conn in self.conns.values_mut() {
            conn.handle_timeout(now, &mut self.events);
        }
    }

    /// The earliest instant any connection has timer work.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let conns = self.conns.values_mut().filter_map(Connection::poll_timeout).min();
        match (conns, self.pacer.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next datagram to send, connections served round robin. The header is written into
    /// `buf` (at least [`wire::TRANSMIT_BUFFER_MIN`] bytes); the payload is named, not copied.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        use core::ops::Bound::{Excluded, Unbounded};
        // Credit first: a grant is due only at the pacer's rate, and it is what keeps this
        // NIC's senders flowing.
        while let Some(grant) = self.pacer.poll_grant(now) {
            match self.conns.get_mut(&grant.conn).and_then(|c| c.emit_grant(&grant, buf)) {
                Some(t) => {
                    if let Some(t) = self.seal(t, buf) {
                        self.stats.datagrams_sent += 1;
                        return Some(t);
                    }
                }
                None => self.pacer.remove(grant.conn),
            }
        }
        // Walk the connections once, starting after the one that sent last; no allocation.
        let mut cursor = self.transmit_cursor;
        for _ in 0..self.conns.len() {
            let next = self
                .conns
                .range((Excluded(cursor), Unbounded))
                .next()
                .or_else(|| self.conns.iter().next())
                .map(|(id, _)| *id)?;
            cursor = next;
            let Some(conn) = self.conns.get_mut(&next) else { continue };
            if let Some(t) = conn.poll_transmit(now, buf) {
                self.transmit_cursor = next;
                if let Some(t) = self.seal(t, buf) {
                    self.stats.datagrams_sent += 1;
                    return Some(t);
                }
            }
        }
        None
    }

    /// Seals what the protocol wrote; a payload the check covers is left to the driver
    /// ([`Transmit::seal_payload`]). `None`: the packet cannot be sealed and is not sent (in
    /// the authenticated mode, a connection without keys, which has no peer to address yet,
    /// or a buffer without room for the tag); the protocol treats it as lost.
    fn seal(&self, mut t: Transmit, buf: &mut [u8]) -> Option<Transmit> {
        let mode = self.config.integrity;
        if mode == wire::Integrity::Mac {
            let handshake = matches!(
                buf.get(wire::field::TYPE).copied().and_then(wire::PacketType::from_u8),
                Some(wire::PacketType::Hello | wire::PacketType::HelloAck)
            );
            let key = if handshake { self.handshake_key? } else { self.conns.get(&t.conn)?.mac?.tx };
            if t.payload.is_some() {
                // Mode byte now, so a driver that forgets to seal is refused for a bad tag.
                *buf.get_mut(wire::field::INTEGRITY)? = mode.to_u8();
                t.seal = crate::api::PendingSeal::Mac(key);
            } else {
                let sealed_len = t.header_len + wire::MAC_TAG_LEN;
                wire::seal_mac(buf.get_mut(..sealed_len)?, &key);
                t.header_len = sealed_len;
            }
        } else if t.payload.is_some() && mode.covers_payload() {
            // Mode byte now, so a driver that forgets to seal is refused for a bad CRC.
            if let Some(b) = buf.get_mut(wire::field::INTEGRITY) {
                *b = mode.to_u8();
            }
            t.seal = crate::api::PendingSeal::Crc;
        } else if let Some(header) = buf.get_mut(..t.header_len) {
            wire::seal(header, mode);
        }
        Some(t)
    }

    /// Drops ended connections once they have nothing left to say.
    fn reap(&mut self) {
        if !self.conns.values().any(Connection::is_ended) {
            return;
        }
        let ended: Vec<ConnectionId> = self.conns.iter().filter(|(_, c)| c.is_ended()).map(|(id, _)| *id).collect();
        for id in ended {
            self.conns.remove(&id);
            self.pacer.remove(id);
        }
        let conns = &self.conns;
        self.accepted.retain(|_, id| conns.contains_key(id));
    }

    /// The next event. Bounded by the operations and connections outstanding: poll it every
    /// time round the driver loop.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Submits a one-sided write on `conn`. The payload is named later by
    /// [`Transmit::payload`] with the returned operation id.
    pub fn write(&mut self, conn: ConnectionHandle, req: WriteRequest) -> Result<OpId, SubmitError> {
        self.conns.get_mut(&conn).ok_or(SubmitError::UnknownConnection)?.write(req)
    }

    /// Submits a two-sided send on `conn`; its payload is named later like a write's.
    pub fn send(&mut self, conn: ConnectionHandle, req: SendRequest) -> Result<OpId, SubmitError> {
        self.conns.get_mut(&conn).ok_or(SubmitError::UnknownConnection)?.send(req)
    }

    /// Closes `conn`: outstanding operations fail with `Closed`, the peer is told once.
    pub fn close(&mut self, conn: ConnectionHandle) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.close(&mut self.events);
        }
    }

    /// Whether `conn` finished its handshake and has not ended.
    pub fn is_established(&self, conn: ConnectionHandle) -> bool {
        self.conns.get(&conn).is_some_and(Connection::is_established)
    }

    /// Counters of one connection.
    pub fn connection_stats(&self, conn: ConnectionHandle) -> Option<ConnectionStats> {
        self.conns.get(&conn).map(Connection::stats)
    }

    /// The agreed configuration of one connection (after the handshake, the minimum of both
    /// sides' proposals).
    pub fn connection_config(&self, conn: ConnectionHandle) -> Option<&crate::config::ConnectionConfig> {
        self.conns.get(&conn).map(Connection::config)
    }

    /// Handles of the connections held.
    pub fn connections(&self) -> impl Iterator<Item = ConnectionHandle> + '_ {
        self.conns.keys().copied()
    }

    pub fn stats(&self) -> &EndpointStats {
        &self.stats
    }

    /// Counters of this NIC's credit pacer (EQDS receiver side).
    pub fn pacer_stats(&self) -> &PacerStats {
        self.pacer.stats()
    }

    /// A human-readable dump of a connection's sender and path state, for diagnosing stalls.
    pub fn diagnose(&self, conn: ConnectionHandle) -> Option<String> {
        self.conns.get(&conn).map(Connection::diagnose)
    }

    /// Checks every connection's invariants (for tests and the simulator, on every event).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.conns.values().try_for_each(Connection::check_invariants)?;
        self.pacer.check_invariants()
    }
}

#[cfg(test)]
mod tests;
