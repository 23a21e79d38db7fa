//! The writer's half of the landing rendezvous: asks per chunk (at most
//! [`LANDING_ASKS_PER_PEER_MAX`] per receiver), writes a granted chunk into its slot, says
//! `Landed`, and completes the chunk on `Done` or a refusal. A chunk of at most
//! [`INLINE_BYTES_MAX`] bytes is sent inside its ask instead (`AskInline`) and waits only for
//! `Done`.

use super::*;

pub(super) enum OutState {
    Asked,
    Writing(Transfer),
    Landed,
}

pub(super) struct Outgoing {
    pub(super) peer: EngineId,
    pub(super) ask: Body,
    pub(super) source: Option<Source>,
    pub(super) done: Arc<TransferState>,
    pub(super) state: OutState,
    pub(super) deadline: Instant,
}

impl LandingThread {
    /// Asks for waiting chunks whose peer has room, in submission order per peer.
    pub(super) fn ask_waiting(&mut self, shared: &Arc<Shared>) -> bool {
        let mut progress = false;
        let mut still = VecDeque::with_capacity(self.waiting.len());
        while let Some(request) = self.waiting.pop_front() {
            if self.asked_per_peer.get(&request.peer).copied().unwrap_or(0) < LANDING_ASKS_PER_PEER_MAX {
                progress = true;
                self.ask(shared, request);
            } else {
                still.push_back(request);
            }
        }
        self.waiting = still;
        progress
    }

    /// Forgets a writer request (finished or failed).
    pub(super) fn remove_out(&mut self, req: u64) -> Option<Outgoing> {
        let out = self.outgoing.remove(&req)?;
        if let Some(n) = self.asked_per_peer.get_mut(&out.peer) {
            *n -= 1;
            if *n == 0 {
                self.asked_per_peer.remove(&out.peer);
            }
        }
        Some(out)
    }

    pub(super) fn ask(&mut self, shared: &Arc<Shared>, request: ChunkRequest) {
        let req = self.next_req;
        self.next_req = self.next_req.wrapping_add(1);
        let (region, key, offset, len) =
            (request.dst.region, request.dst.key, request.dst_offset, request.source.len());
        // A chunk small enough rides in its ask: nothing is left to write, and the next word
        // from the receiver is `Done` (or a refusal).
        let inline = self.inline.then(|| inline_bytes(&request.source)).flatten();
        let (ask, source, state) = match inline {
            Some(bytes) => {
                let ask = Body::AskInline { region, key, offset, len: len as u8, bytes };
                (ask, None, OutState::Landed)
            }
            None => (Body::Ask { region, key, offset, len }, Some(request.source), OutState::Asked),
        };
        if !self.send(shared, request.peer, req, ask) {
            request.done.part_done(Err(TransferError::PeerUnreachable));
            return;
        }
        if inline.is_some() {
            self.stats.chunks_inline += 1;
        }
        *self.asked_per_peer.entry(request.peer).or_insert(0) += 1;
        self.outgoing.insert(
            req,
            Outgoing {
                peer: request.peer,
                ask,
                source,
                done: request.done,
                state,
                deadline: Instant::now() + self.timeout,
            },
        );
    }

    /// A grant `m` for one of our asks: writes the chunk into the granted slot.
    pub(super) fn on_grant(&mut self, shared: &Arc<Shared>, m: Control) -> bool {
        let Body::Grant { region, key, offset, len } = m.body else { return false };
        let Some(out) = self.outgoing.get_mut(&m.req) else { return false };
        let asked_len = match out.ask {
            Body::Ask { len, .. } => len,
            _ => 0,
        };
        if out.peer != m.from || !matches!(out.state, OutState::Asked) || len != asked_len {
            return false;
        }
        let Some(source) = out.source.take() else { return false };
        let landing =
            MrDescriptor { engine: m.from, region, key, len: offset.saturating_add(len), device: None, shared: None };
        let chunk = shared.new_internal_transfer(1);
        let kind = write_kind(&landing, offset, None);
        dispatch_part(shared, PartSpec { peer: m.from, kind, source, lane: None }, chunk.clone());
        out.state = OutState::Writing(Transfer { state: chunk });
        out.deadline = Instant::now() + self.timeout;
        true
    }

    pub(super) fn poll_writes(&mut self, shared: &Arc<Shared>) -> bool {
        let mut ended = vec![];
        for (req, out) in &mut self.outgoing {
            let OutState::Writing(transfer) = &out.state else { continue };
            match transfer.poll() {
                None => {}
                Some(Ok(())) => {
                    out.state = OutState::Landed;
                    out.deadline = Instant::now() + self.timeout;
                    ended.push((*req, out.peer, None));
                }
                Some(Err(e)) => ended.push((*req, out.peer, Some(e))),
            }
        }
        for (req, peer, error) in &ended {
            match error {
                None => {
                    self.send(shared, *peer, *req, Body::Landed);
                }
                Some(e) => {
                    self.send(shared, *peer, *req, Body::Abandon);
                    if let Some(out) = self.remove_out(*req) {
                        out.done.part_done(Err(*e));
                    }
                }
            }
        }
        !ended.is_empty()
    }

    pub(super) fn finish_out(&mut self, m: Control, result: Result<(), TransferError>) -> bool {
        let Some(out) = self.outgoing.get(&m.req) else { return false };
        let fits = matches!(
            (&out.state, result.is_ok()),
            (OutState::Landed, true) | (OutState::Asked | OutState::Landed, false)
        );
        if out.peer != m.from || !fits {
            return false;
        }
        let out = self.remove_out(m.req).expect("looked up above");
        out.done.part_done(result);
        true
    }
}

/// The chunk's bytes, zero-padded, when it is small enough to travel inside its ask.
fn inline_bytes(source: &Source) -> Option<[u8; INLINE_BYTES_MAX]> {
    let len = usize::try_from(source.len()).ok().filter(|n| (1..=INLINE_BYTES_MAX).contains(n))?;
    let mut bytes = [0u8; INLINE_BYTES_MAX];
    source.read(0, &mut bytes[..len]).then_some(bytes)
}
