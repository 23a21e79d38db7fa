//! Where a batched READ's pieces are: the geometry its request carries besides the page ids,
//! and the one function that turns both into checked runs (the reader's check before sending,
//! the owner's before writing back).

use crate::engine::route::read::limits::READ_PIECES_PER_REQUEST_MAX;
use crate::memory::check_range;

/// Where the pieces of a batched read are, apart from the page ids.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) src_offset: u64,
    pub(crate) src_stride: u64,
    pub(crate) dst_offset: u64,
    pub(crate) dst_stride: u64,
    pub(crate) page_bytes: u64,
    pub(crate) planes: u64,
    pub(crate) src_plane_stride: u64,
    pub(crate) dst_plane_stride: u64,
}

/// Why a piece is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PieceError {
    /// The geometry itself (a zero page, a destination stride below the page, no planes).
    Shape(String),
    /// An offset overflows 64 bits.
    Overflow(String),
    /// A source piece falls outside the source region.
    Source(String),
    /// A destination piece falls outside the destination region.
    Destination(String),
}

impl PieceError {
    pub(crate) fn message(self) -> String {
        match self {
            PieceError::Shape(m) | PieceError::Overflow(m) | PieceError::Source(m) | PieceError::Destination(m) => m,
        }
    }
}

impl Geometry {
    /// The shape's own rules, before any page.
    pub(crate) fn check(&self) -> Result<(), PieceError> {
        if self.page_bytes == 0 {
            return Err(PieceError::Shape("page_bytes must be at least 1".into()));
        }
        if self.dst_stride < self.page_bytes {
            return Err(PieceError::Shape(format!(
                "destination stride {} is smaller than the page ({} bytes): destination pages would overlap",
                self.dst_stride, self.page_bytes
            )));
        }
        if self.planes == 0 || self.planes > READ_PIECES_PER_REQUEST_MAX as u64 {
            return Err(PieceError::Shape(format!(
                "planes must be 1..={READ_PIECES_PER_REQUEST_MAX}, got {}",
                self.planes
            )));
        }
        Ok(())
    }

    /// The pieces of `pages` (source page, destination page) in every plane, as runs
    /// `(destination offset, source offset, bytes)`; every piece checked against both regions'
    /// lengths. Nothing is returned unless every piece is good.
    ///
    /// Order: pages consecutive on both sides are grouped first (one run a plane), and each group
    /// is listed in every plane before the next group, block by block rather than plane by plane.
    /// The pieces of one request are unordered (a batch of copies runs in any order), so the order
    /// changes no outcome; it makes a group's pieces one run of equal pieces at constant strides
    /// (the plane strides), which the copy-engine route moves as one 2D copy
    /// (`device::copy_plan`), instead of one copy per piece.
    pub(crate) fn runs(
        &self,
        pages: &[(u64, u64)],
        src_len: u64,
        dst_len: u64,
    ) -> Result<Vec<(u64, u64, u64)>, PieceError> {
        self.check()?;
        let at = |side: &str, base: u64, plane: u64, plane_stride: u64, page: u64, stride: u64, i: usize| {
            plane
                .checked_mul(plane_stride)
                .and_then(|p| page.checked_mul(stride).and_then(|o| o.checked_add(p)))
                .and_then(|o| o.checked_add(base))
                .ok_or_else(|| {
                    PieceError::Overflow(format!(
                        "page {i} of plane {plane}: {side} offset {base} + plane {plane} x {plane_stride} + page {page} x {stride} overflows 64 bits"
                    ))
                })
        };
        let piece = |plane: u64, i: usize, (s, d): (u64, u64)| -> Result<(u64, u64), PieceError> {
            let so = at("source", self.src_offset, plane, self.src_plane_stride, s, self.src_stride, i)?;
            let doff = at("destination", self.dst_offset, plane, self.dst_plane_stride, d, self.dst_stride, i)?;
            if !check_range(so, self.page_bytes, src_len) {
                return Err(PieceError::Source(format!(
                    "page {i} of plane {plane}: remote source bytes {so}..{so}+{} fall outside the remote region of {src_len} bytes",
                    self.page_bytes
                )));
            }
            if !check_range(doff, self.page_bytes, dst_len) {
                return Err(PieceError::Destination(format!(
                    "page {i} of plane {plane}: local destination bytes {doff}..{doff}+{} fall outside the local region of {dst_len} bytes",
                    self.page_bytes
                )));
            }
            Ok((so, doff))
        };
        // Groups of pages consecutive on both sides (in plane 0's offsets; planes only shift them).
        let mut groups: Vec<(usize, usize)> = vec![]; // (first page index, pages)
        let mut last: Option<(u64, u64)> = None;
        for (i, &page) in pages.iter().enumerate() {
            let (so, doff) = piece(0, i, page)?;
            match (groups.last_mut(), last) {
                (Some((_, n)), Some((ls, ld))) if ls + self.page_bytes == so && ld + self.page_bytes == doff => *n += 1,
                _ => groups.push((i, 1)),
            }
            last = Some((so, doff));
        }
        let mut runs: Vec<(u64, u64, u64)> = Vec::with_capacity(groups.len() * self.planes as usize);
        for &(first, n) in &groups {
            for plane in 0..self.planes {
                let (so, doff) = piece(plane, first, pages[first])?;
                for (i, &page) in pages.iter().enumerate().skip(first + 1).take(n - 1) {
                    piece(plane, i, page)?; // checks it; its bytes continue the group's run
                }
                let len = self.page_bytes * n as u64;
                match runs.last_mut() {
                    Some((rd, rs, l)) if *rs + *l == so && *rd + *l == doff => *l += len,
                    _ => runs.push((doff, so, len)),
                }
            }
        }
        Ok(runs)
    }
}
