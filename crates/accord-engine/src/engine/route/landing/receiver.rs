//! The receiver's half of the landing rendezvous: checks asks, grants slots of its pinned
//! pool (one host region per slot), copies landed chunks host-to-device and says `Done`. An
//! inline ask's bytes go into a slot here and are copied without a grant.

use super::*;

pub(super) enum InState {
    Queued,
    Granted(SlotLease),
    /// The slot stays leased (never read here) until the copy out of it ended.
    Copying(#[allow(dead_code)] SlotLease, u64),
}

pub(super) struct Incoming {
    pub(super) dst_ptr: u64,
    pub(super) ordinal: u32,
    pub(super) len: u64,
    /// The chunk's bytes when they came inside the ask: copied from a slot as soon as one is
    /// free, with no grant.
    pub(super) inline: Option<[u8; INLINE_BYTES_MAX]>,
    pub(super) _keep: Option<MemoryOwner>,
    pub(super) state: InState,
    pub(super) deadline: Instant,
}

/// The answers of the last [`INLINE_ANSWERS_KEPT`] inline asks, by (writer, request).
pub(super) type InlineAnswers = crate::recent::Recent<(EngineId, u64), Body, INLINE_ANSWERS_KEPT>;

/// The receiver's landing pool: each slot is a host region of its own, so a grant's key opens
/// that slot only; a slot reclaimed from a quiet writer gets a new region id and key first, so
/// a late write of that writer is refused by the transport instead of landing in the slot's
/// next grant.
pub(super) struct Pool {
    pub(super) slots: Arc<SlotPool>,
    pub(super) copier: Box<dyn LandingCopier>,
    pub(super) slot_regions: Vec<(RegionId, RegionKey)>,
    /// Slots that could not be re-registered after a reclaim: kept out of use.
    pub(super) retired: Vec<SlotLease>,
}

impl Pool {
    pub(super) fn slot_index(&self, lease: &SlotLease) -> usize {
        (lease.addr() - self.slots.base_addr()) / self.slots.slot_bytes()
    }

    /// Registers slot `index` as a host region under a fresh key.
    pub(super) fn register_slot(
        shared: &Shared,
        slots: &Arc<SlotPool>,
        index: usize,
    ) -> Result<(RegionId, RegionKey), String> {
        let key = RegionKey(crate::engine::random_u64());
        let keep: MemoryOwner = slots.clone();
        let base = slots.base_addr() + index * slots.slot_bytes();
        let region =
            Region { base, len: slots.slot_bytes() as u64, key, keep: Some(keep), device: None, streamed: false };
        let id = shared.regions.write().unwrap().insert(region).map_err(|e| e.to_string())?;
        Ok((id, key))
    }

    /// Takes a reclaimed slot back: a new region and key for it, then back into the pool.
    pub(super) fn reclaim(&mut self, shared: &Shared, lease: SlotLease) {
        let index = self.slot_index(&lease);
        shared.regions.write().unwrap().remove(self.slot_regions[index].0);
        match Pool::register_slot(shared, &self.slots, index) {
            Ok(fresh) => self.slot_regions[index] = fresh,
            Err(e) => {
                tracing::error!(error = %e, "landing slot could not be registered again; retired");
                self.retired.push(lease);
            }
        }
    }
}

impl LandingThread {
    /// An ask `m` from a writer: checks the destination, then grants a slot or refuses.
    pub(super) fn on_ask(&mut self, shared: &Arc<Shared>, m: Control) -> bool {
        let (region, key, offset, len, inline) = match m.body {
            Body::Ask { region, key, offset, len } => (region, key, offset, len, None),
            Body::AskInline { region, key, offset, len, bytes } => (region, key, offset, u64::from(len), Some(bytes)),
            _ => return false,
        };
        let id = (m.from, m.req);
        if self.incoming.contains_key(&id) {
            return false; // a duplicate
        }
        if inline.is_some() {
            if let Some(&answer) = self.inline_answers.get(&id) {
                // Delivered again after it was answered: the same answer, and no second copy.
                self.stats.inline_duplicates += 1;
                self.send(shared, m.from, m.req, answer);
                return true;
            }
        }
        let checked = {
            let regions = shared.regions.read().unwrap();
            regions
                .check_device_write(RegionId(region), RegionKey(key), offset, len)
                .map(|(ptr, ordinal)| (ptr, ordinal, regions.get(RegionId(region)).and_then(|r| r.keep.clone())))
        };
        let refusal = match checked {
            Err(reason) => Some(reason),
            Ok(_) if self.incoming.len() >= LANDING_ASKS_MAX => Some(RejectReason::TooManyMessages),
            Ok((_, ordinal, _)) => match self.pool(shared, ordinal) {
                Err(_) => Some(RejectReason::Other(0xDE71)),
                Ok(pool) if len == 0 || len > pool.slots.slot_bytes() as u64 => Some(RejectReason::MessageTooLarge),
                Ok(_) => None,
            },
        };
        if let Some(reason) = refusal {
            self.stats.asks_refused += 1;
            if inline.is_some() {
                self.inline_answers.insert(id, Body::Refuse { reason });
            }
            self.send(shared, m.from, m.req, Body::Refuse { reason });
            return true;
        }
        let Ok((dst_ptr, ordinal, keep)) = checked else { return true };
        let deadline = Instant::now() + self.timeout;
        let state = InState::Queued;
        self.incoming.insert(id, Incoming { dst_ptr, ordinal, len, inline, _keep: keep, state, deadline });
        self.queued.push_back(id);
        self.grant_queued(shared);
        true
    }

    /// The receiver's pool, opened on the first ask.
    pub(super) fn pool(&mut self, shared: &Arc<Shared>, ordinal: u32) -> Result<&mut Pool, String> {
        if self.pool.is_none() {
            let opener = shared.landing.opener.lock().unwrap().take();
            let opened = match opener {
                Some(open) => usize::try_from(shared.config.device_staging_chunk_bytes)
                    .map_err(|_| "landing slot size does not fit".to_string())
                    .and_then(|slot_bytes| {
                        let (memory, copier) = open(ordinal, slot_bytes, shared.config.device_staging_chunks)?;
                        let slots = SlotPool::new(memory, slot_bytes);
                        let slot_regions = (0..slots.slot_count())
                            .map(|index| Pool::register_slot(shared, &slots, index))
                            .collect::<Result<Vec<_>, _>>()?;
                        Ok(Pool { slots, copier, slot_regions, retired: vec![] })
                    }),
                None => Err("landing pool already failed to open".into()),
            };
            if let Err(e) = &opened {
                tracing::error!(error = %e, "device landing pool unavailable");
            }
            self.pool = Some(opened);
        }
        self.pool.as_mut().expect("set above").as_mut().map_err(|e| e.clone())
    }

    pub(super) fn grant_queued(&mut self, shared: &Arc<Shared>) {
        while let Some(&id) = self.queued.front() {
            let Some(Ok(pool)) = self.pool.as_ref() else { return };
            let Some(entry) = self.incoming.get_mut(&id) else {
                self.queued.pop_front();
                continue;
            };
            let Some(mut lease) = pool.slots.take() else { return };
            self.queued.pop_front();
            entry.deadline = Instant::now() + self.timeout;
            if let Some(bytes) = entry.inline {
                // The bytes are here already: into the slot, and the copy starts now.
                let Some(Ok(pool)) = self.pool.as_mut() else { return };
                let len = entry.len as usize;
                entry.state = if lease.fill(&bytes[..len]) {
                    start_copy(pool, entry, lease)
                } else {
                    InState::Copying(lease, u64::MAX) // fails the chunk; slots are never this small
                };
                continue;
            }
            let (region, key) = pool.slot_regions[pool.slot_index(&lease)];
            let grant = Body::Grant { region: region.0, key: key.0, offset: 0, len: entry.len };
            entry.state = InState::Granted(lease);
            self.send(shared, id.0, id.1, grant);
        }
    }

    /// A writer gave up on a chunk: forget it unless its copy is running (the slot stays leased
    /// to the copy until it ended).
    pub(super) fn on_abandon(&mut self, m: Control) -> bool {
        let id = (m.from, m.req);
        match self.incoming.get(&id) {
            Some(entry) if !matches!(entry.state, InState::Copying(..)) => self.incoming.remove(&id).is_some(),
            _ => false,
        }
    }

    pub(super) fn on_landed(&mut self, m: Control) -> bool {
        let Some(Ok(pool)) = self.pool.as_mut() else { return false };
        let Some(entry) = self.incoming.get_mut(&(m.from, m.req)) else { return false };
        let InState::Granted(_) = entry.state else { return false };
        let InState::Granted(lease) = std::mem::replace(&mut entry.state, InState::Queued) else { unreachable!() };
        entry.state = start_copy(pool, entry, lease);
        true
    }

    pub(super) fn poll_copies(&mut self, shared: &Arc<Shared>) -> bool {
        let Some(Ok(pool)) = self.pool.as_mut() else { return false };
        let mut ended = vec![];
        for (id, entry) in &self.incoming {
            if let InState::Copying(_, ticket) = entry.state {
                let result =
                    if ticket == u64::MAX { Err("copy did not start".into()) } else { pool.copier.poll(ticket) };
                match result {
                    Ok(false) => {}
                    Ok(true) => ended.push((*id, Body::Done)),
                    Err(e) => {
                        tracing::error!(error = %e, "landing copy failed");
                        ended.push((*id, Body::Refuse { reason: RejectReason::Other(0xDE72) }));
                    }
                }
            }
        }
        for (id, body) in &ended {
            let entry = self.incoming.remove(id); // frees the slot
            if entry.is_some_and(|e| e.inline.is_some()) {
                self.inline_answers.insert(*id, *body);
            }
            if *body == Body::Done {
                self.stats.chunks_landed += 1;
            }
            self.send(shared, id.0, id.1, *body);
        }
        if !ended.is_empty() {
            self.grant_queued(shared);
        }
        !ended.is_empty()
    }
}

/// Starts copying `entry`'s chunk out of `lease` into device memory: `Copying` with the copy's
/// ticket, or with `u64::MAX` when it could not start (the chunk then fails at the next poll).
fn start_copy(pool: &mut Pool, entry: &Incoming, lease: SlotLease) -> InState {
    match pool.copier.start(lease.addr(), entry.dst_ptr, entry.ordinal, entry.len as usize) {
        Ok(ticket) => InState::Copying(lease, ticket),
        Err(e) => {
            tracing::error!(error = %e, "landing copy could not start");
            InState::Copying(lease, u64::MAX)
        }
    }
}
