//! A batched READ's request as frames, and the owner's assemblies of the frames it received
//! (in any order, bounded: see [`READ_ASSEMBLIES_MAX`] and [`READ_ASSEMBLY_FRAMES_MAX`]).

use std::collections::{HashMap, VecDeque};

use accord_proto::wire::RejectReason;

use super::geometry::Geometry;
use crate::address::EngineId;
use crate::engine::route::read::limits::{READ_PIECES_PER_REQUEST_MAX, READ_REQUESTS_IN_FLIGHT_MAX};

/// Requests an owner assembles at once (all readers together); past that the oldest is refused
/// (`TooManyMessages`), so a reader that died mid-request holds no memory for long. As many as
/// one reader may have outstanding ([`READ_REQUESTS_IN_FLIGHT_MAX`]): a reader's own requests
/// never push each other out.
pub const READ_ASSEMBLIES_MAX: usize = READ_REQUESTS_IN_FLIGHT_MAX;
/// Frames (64 bytes on the wire, about 50 held) all assemblies of an owner hold together; past
/// that the oldest requests are refused. Sixteen requests of the largest size.
pub const READ_ASSEMBLY_FRAMES_MAX: usize = 16 * FRAMES_MAX as usize;
/// Frames before the page pairs.
pub(crate) const HEADER_FRAMES: u32 = 3;
/// Page pairs per frame.
pub(crate) const PAGES_PER_FRAME: usize = 4;

/// One batched request's fields, as its frames carry them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PagedRequest {
    pub(crate) src_region: u32,
    pub(crate) src_key: u64,
    pub(crate) dst_region: u32,
    pub(crate) dst_key: u64,
    pub(crate) dst_device: bool,
    pub(crate) geometry: Geometry,
    /// (source page, destination page).
    pub(crate) pages: Vec<(u64, u64)>,
}

impl PagedRequest {
    /// The request's frames: (index, first half-word, words).
    pub(crate) fn frames(&self) -> Vec<(u32, u32, [u64; 4])> {
        let g = &self.geometry;
        let mut frames = vec![
            (0, self.src_region, [self.src_key, self.dst_key, g.src_offset, g.dst_offset]),
            (1, self.dst_region, [g.src_stride, g.dst_stride, g.page_bytes, self.pages.len() as u64]),
            (2, 0, [g.planes, g.src_plane_stride, g.dst_plane_stride, 0]),
        ];
        for (k, chunk) in self.pages.chunks(PAGES_PER_FRAME).enumerate() {
            let mut words = [0u64; 4];
            for (w, &(s, d)) in words.iter_mut().zip(chunk) {
                *w = s | d << 32;
            }
            frames.push((HEADER_FRAMES + k as u32, chunk.len() as u32, words));
        }
        frames
    }
}

/// Frames of one request received so far (owner side).
#[derive(Default)]
struct Assembly {
    headers: [Option<(u32, [u64; 4])>; HEADER_FRAMES as usize],
    pages: HashMap<u32, (u32, [u64; 4])>,
    dst_device: bool,
}

impl Assembly {
    /// Pages the request says it has (once header 1 arrived).
    fn pages_expected(&self) -> Option<u64> {
        self.headers[1].map(|(_, w)| w[3])
    }

    /// The request, once every frame arrived; `Err` when the frames contradict themselves.
    fn complete(&self) -> Option<Result<PagedRequest, RejectReason>> {
        let [Some((src_region, h0)), Some((dst_region, h1)), Some((_, h2))] = self.headers else { return None };
        let pages = h1[3] as usize;
        let frames = pages.div_ceil(PAGES_PER_FRAME);
        if self.pages.len() < frames {
            return None;
        }
        let mut pairs = Vec::with_capacity(pages);
        for k in 0..frames {
            let want = (pages - k * PAGES_PER_FRAME).min(PAGES_PER_FRAME);
            match self.pages.get(&(HEADER_FRAMES + k as u32)) {
                Some(&(count, words)) if count as usize == want => {
                    pairs.extend(words[..want].iter().map(|w| (w & 0xffff_ffff, w >> 32)));
                }
                _ => return Some(Err(RejectReason::MessageTooLarge)),
            }
        }
        let geometry = Geometry {
            src_offset: h0[2],
            dst_offset: h0[3],
            src_stride: h1[0],
            dst_stride: h1[1],
            page_bytes: h1[2],
            planes: h2[0],
            src_plane_stride: h2[1],
            dst_plane_stride: h2[2],
        };
        Some(Ok(PagedRequest {
            src_region,
            src_key: h0[0],
            dst_region,
            dst_key: h0[1],
            dst_device: self.dst_device,
            geometry,
            pages: pairs,
        }))
    }
}

/// The requests an owner is assembling, oldest first (at most [`READ_ASSEMBLIES_MAX`], holding
/// at most [`READ_ASSEMBLY_FRAMES_MAX`] frames together).
#[derive(Default)]
pub(crate) struct Assemblies {
    map: HashMap<(EngineId, u64), Assembly>,
    order: VecDeque<(EngineId, u64)>,
    /// Frames held by every assembly together.
    frames: usize,
}

/// What one frame did to its request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// More frames to come.
    Partial,
    /// Every frame arrived: the request (or why it is malformed).
    Complete(Result<PagedRequest, RejectReason>),
    /// The frame is refused (the request is dropped and refused with this reason).
    Refused(RejectReason),
}

/// Most frames one request may have.
pub(super) const FRAMES_MAX: u32 = HEADER_FRAMES + READ_PIECES_PER_REQUEST_MAX.div_ceil(PAGES_PER_FRAME) as u32;

impl Assembly {
    fn frames(&self) -> usize {
        self.headers.iter().flatten().count() + self.pages.len()
    }
}

impl Assemblies {
    /// Takes frame `index` of request `req` from `from`; also the requests dropped to make room
    /// for it, oldest first (to be refused).
    pub(crate) fn take(
        &mut self,
        from: EngineId,
        req: u64,
        index: u32,
        half: u32,
        words: [u64; 4],
        dst_device: bool,
    ) -> (Taken, Vec<(EngineId, u64)>) {
        let key = (from, req);
        if index >= FRAMES_MAX || (index >= HEADER_FRAMES && !(1..=PAGES_PER_FRAME as u32).contains(&half)) {
            self.drop_one(key);
            return (Taken::Refused(RejectReason::MessageTooLarge), vec![]);
        }
        if !self.map.contains_key(&key) {
            self.order.push_back(key);
        }
        let assembly = self.map.entry(key).or_default();
        assembly.dst_device |= dst_device;
        let fresh = if index < HEADER_FRAMES {
            assembly.headers[index as usize].replace((half, words)).is_none()
        } else {
            assembly.pages.insert(index, (half, words)).is_none()
        };
        // A page frame past the pages the request says it has (checked as each frame arrives,
        // and against every frame so far when the count arrives).
        let page_frames = |n: u64| n.div_ceil(PAGES_PER_FRAME as u64);
        let too_many = match assembly.pages_expected() {
            None => false,
            Some(n) if n > READ_PIECES_PER_REQUEST_MAX as u64 => true,
            Some(n) if index >= HEADER_FRAMES => u64::from(index - HEADER_FRAMES) >= page_frames(n),
            Some(n) if index == 1 => assembly.pages.keys().any(|&i| u64::from(i - HEADER_FRAMES) >= page_frames(n)),
            Some(_) => false,
        };
        let outcome = match (too_many, assembly.complete()) {
            (true, _) => Taken::Refused(RejectReason::MessageTooLarge),
            (false, Some(done)) => Taken::Complete(done),
            (false, None) => Taken::Partial,
        };
        self.frames += usize::from(fresh);
        if outcome != Taken::Partial {
            self.drop_one(key);
            return (outcome, vec![]);
        }
        // Room: the oldest other requests go first.
        let mut evicted = vec![];
        while self.order.len() > READ_ASSEMBLIES_MAX || self.frames > READ_ASSEMBLY_FRAMES_MAX {
            let Some(&oldest) = self.order.iter().find(|k| **k != key) else { break };
            self.drop_one(oldest);
            evicted.push(oldest);
        }
        (outcome, evicted)
    }

    fn drop_one(&mut self, key: (EngineId, u64)) {
        if let Some(gone) = self.map.remove(&key) {
            self.frames -= gone.frames();
            self.order.retain(|k| *k != key);
        }
    }

    /// Requests being assembled.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Frames held.
    #[cfg(test)]
    pub(crate) fn frames(&self) -> usize {
        self.frames
    }
}
