//! Planning a batch of device-to-device pieces into as few copy-engine operations as their
//! layout allows: runs of equal pieces at constant strides become one 2D copy each
//! (`cuMemcpy2DAsync`), everything else goes flat in batched 1D calls (`cuMemcpyBatchAsync`).
//!
//! Why: the copy engine's cost is per copy, not per byte, for pieces of tens of KiB. A KV
//! request of 2,048 blocks in a Llama-3-70B-like layout is 327,680 pieces of 32 KiB; batched as
//! 1D copies it moved at 0.6-0.9 us a piece, an eighth of the copy ceiling
//! (docs/results/2026-11-26-kv-gpu.md). A block's 160 pieces (every layer's K and V) sit whole
//! cache planes apart on both sides, so listed block by block they are one 2D copy of 160 rows:
//! 2,048 operations instead of 327,680.
//!
//! Two further steps, both because 2,048 2D copies on one stream still reached only 0.55-0.65
//! of the copy ceiling (docs/results/2026-11-26-kv-gpu.md): [`spread`] divides a plan by bytes
//! into shares, one per copy stream, so several copy engines work on one request; and [`issue`]
//! can hand a share's 2D copies to the sink as one batch (`cuMemcpy3DBatchAsync`: a call per
//! 1,024 copies instead of one each).
//!
//! [`plan`] and [`spread`] are pure functions (tested by tables of cases); [`issue`] hands a plan
//! to a [`CopySink`] (a CUDA stream in [`super::DeviceRoute::copy_many`], a host-memory
//! recorder in tests).
//!
//! On the default shape (one stream, a call per 2D copy) the route does not build the whole plan
//! first: [`issue_streamed`] feeds the pieces through a [`Planner`] (the same greedy rule, one
//! piece at a time) and queues every [`STREAM_COPIES_PER_STEP`] 2D copies as they are found, so
//! the copy engine starts on a write's first blocks while the host plans the rest; the pieces
//! are shifted from region offsets to device addresses on the way in, without a list of their
//! own. Every piece was checked before (`page_runs`, a READ's `Geometry::runs`), so a refused
//! write still moves nothing. The host stages at 2,048 blocks, before and after:
//! `cargo test --release -p accord-engine --lib paged_host_cost -- --ignored --nocapture`.

/// One 2D copy: `height` rows of `width` bytes, row `r` read at `src + r * src_pitch` and
/// written at `dst + r * dst_pitch`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Strided {
    pub(crate) dst: u64,
    pub(crate) dst_pitch: u64,
    pub(crate) src: u64,
    pub(crate) src_pitch: u64,
    pub(crate) width: u64,
    pub(crate) height: u64,
}

impl Strided {
    /// Bytes the copy moves.
    pub(crate) fn bytes(&self) -> u64 {
        self.width * self.height
    }

    /// The rows as flat pieces `(dst, src, len)`.
    pub(crate) fn rows(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        (0..self.height).map(move |r| (self.dst + r * self.dst_pitch, self.src + r * self.src_pitch, self.width))
    }
}

/// What [`plan`] makes of a batch: the 2D copies, and the pieces left flat, each in the order
/// of the batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CopyPlan {
    pub(crate) strided: Vec<Strided>,
    pub(crate) flat: Vec<(u64, u64, u64)>,
}

/// Fewest consecutive pieces that become a 2D copy: one 2D call costs the host about what a
/// short 1D batch does, and a pair of pieces is already one copy-engine operation instead of two.
pub(crate) const ROWS_MIN: u64 = 2;

/// Plans `pieces` (`(dst, src, len)`, device addresses in one context) into 2D copies and flat
/// pieces. Consecutive pieces form a run when they have the same length and the same positive
/// step from one to the next on each side (the pitches); a run of at least [`ROWS_MIN`] pieces
/// whose pitches are both at least its width (rows never overlap, as the driver requires) and at
/// most `max_pitch` (the device's `CU_DEVICE_ATTRIBUTE_MAX_PITCH`; 0: no 2D copies) becomes one
/// 2D copy. Greedy, left to right: the run starting at a piece takes every piece that continues
/// it. Every byte of every piece is copied exactly once, and no piece's bytes change place, so
/// the plan moves what the pieces one by one would (pieces of one batch are unordered anyway).
pub(crate) fn plan(pieces: &[(u64, u64, u64)], max_pitch: u64) -> CopyPlan {
    let mut out = CopyPlan::default();
    let mut planner = Planner::new(max_pitch);
    for &piece in pieces {
        planner.push(piece, &mut out);
    }
    planner.finish(&mut out);
    out
}

/// [`plan`] one piece at a time: pieces go in with [`Planner::push`], and every 2D copy or flat
/// piece is appended to the caller's [`CopyPlan`] as soon as the piece after it shows where its
/// run ends, so a caller can queue the first copies while later pieces are still being read
/// ([`issue_streamed`]). Fed the same pieces, it makes exactly [`plan`]'s copies, in its order.
///
/// Why a state machine rather than a look-ahead over a slice: the pieces then need not exist as
/// a list of their own (the copy-engine route shifts page offsets to device addresses on the
/// way in), and planning costs one pass, with no allocation but the plan's.
#[derive(Clone, Debug)]
pub(crate) struct Planner {
    max_pitch: u64,
    /// The run being built: its first piece, its pitches once a second piece joined, its rows,
    /// and its last piece (what the next piece must continue).
    run: Option<Run>,
}

#[derive(Copy, Clone, Debug)]
struct Run {
    first: (u64, u64, u64),
    pitches: Option<(u64, u64)>,
    height: u64,
    last: (u64, u64, u64),
}

impl Planner {
    pub(crate) fn new(max_pitch: u64) -> Planner {
        Planner { max_pitch, run: None }
    }

    /// Adds the next piece; copies whose run it ends go to `out`.
    pub(crate) fn push(&mut self, piece: (u64, u64, u64), out: &mut CopyPlan) {
        let (d, s, l) = piece;
        let Some(run) = self.run.as_mut() else {
            self.run = Some(Run { first: piece, pitches: None, height: 1, last: piece });
            return;
        };
        let (pd, ps, width) = run.last;
        let continues = match run.pitches {
            // A run of one piece: `piece` may start its rows (the pitches must fit the driver).
            None => {
                let max_pitch = self.max_pitch;
                let fits = |p: u64| p >= width && p <= max_pitch && p > 0;
                let step = d.checked_sub(pd).zip(s.checked_sub(ps));
                match step {
                    Some((dp, sp)) if l == width && fits(dp) && fits(sp) => {
                        run.pitches = Some((dp, sp));
                        true
                    }
                    _ => false,
                }
            }
            Some((dp, sp)) => l == width && d.checked_sub(pd) == Some(dp) && s.checked_sub(ps) == Some(sp),
        };
        if continues {
            run.height += 1;
            run.last = piece;
            return;
        }
        let ended = *run;
        self.run = Some(Run { first: piece, pitches: None, height: 1, last: piece });
        close(ended, out);
    }

    /// Ends the last run (its copy goes to `out`).
    pub(crate) fn finish(&mut self, out: &mut CopyPlan) {
        if let Some(run) = self.run.take() {
            close(run, out);
        }
    }
}

/// A finished run into `out`: one 2D copy, or its pieces flat when it has too few rows.
fn close(run: Run, out: &mut CopyPlan) {
    let (dst, src, width) = run.first;
    match run.pitches {
        Some((dst_pitch, src_pitch)) if run.height >= ROWS_MIN => {
            out.strided.push(Strided { dst, dst_pitch, src, src_pitch, width, height: run.height });
        }
        Some((dst_pitch, src_pitch)) => {
            let copy = Strided { dst, dst_pitch, src, src_pitch, width, height: run.height };
            out.flat.extend(copy.rows());
        }
        None => out.flat.push(run.first),
    }
}

/// 2D copies [`issue_streamed`] plans before it queues them: few enough that the copy engine
/// starts within a few microseconds of planning, enough that issuing is not interleaved with
/// planning piece by piece. (A KV block is one 2D copy: a 2,048-block write goes in 32 steps.)
pub(crate) const STREAM_COPIES_PER_STEP: usize = 64;

/// Plans `pieces` as [`plan`] does and queues the copies on `sink` as [`issue`] does (one copy
/// stream, 2D copies one call each), but in steps: every `per_step` 2D copies planned are queued
/// at once, so the copy engine works on the first ones while the rest are planned; the flat
/// pieces, gathered meanwhile, go last in one call. The same copies, in the same order, as
/// `issue(&plan(pieces), sink, false)` wherever the sink takes every 2D copy (a refused one goes
/// as its rows right after its step instead of after the whole plan). `pieces` is any iterator,
/// so the caller shifts offsets to addresses on the way in instead of building a list of them.
pub(crate) fn issue_streamed(
    pieces: impl IntoIterator<Item = (u64, u64, u64)>,
    max_pitch: u64,
    sink: &mut dyn CopySink,
    per_step: usize,
) -> Result<Issued, String> {
    let per_step = per_step.max(1);
    let mut total = Issued::default();
    let mut step = CopyPlan::default();
    let mut flat = vec![];
    let mut planner = Planner::new(max_pitch);
    let mut queue = |step: &mut CopyPlan, total: &mut Issued| -> Result<(), String> {
        issue_into(step, sink, false, total)?;
        step.strided.clear();
        step.flat.clear();
        Ok(())
    };
    for piece in pieces {
        planner.push(piece, &mut step);
        if step.strided.len() >= per_step {
            // Flat pieces wait for the end, so that they still go in one call.
            flat.append(&mut step.flat);
            queue(&mut step, &mut total)?;
        }
    }
    planner.finish(&mut step);
    flat.append(&mut step.flat);
    step.flat = flat;
    queue(&mut step, &mut total)?;
    Ok(total)
}

/// Fewest bytes a share of a spread plan should have: a plan of fewer than twice this stays on
/// one stream. Below it the fork and join of another stream (an event recorded and waited for
/// each way) cost the host about what the overlap could save; small writes (a device-API put,
/// an NCCL plugin chunk) so keep the single stream and single event they had.
pub(crate) const SHARE_BYTES_MIN: u64 = 4 << 20;

/// Divides `plan` into at most `shares` plans of about equal bytes, for as many copy streams,
/// and no more than leaves each `share_bytes_min` bytes ([`SHARE_BYTES_MIN`] on the route):
/// each copy (a 2D copy whole, or a flat
/// piece) goes to the share with the fewest bytes so far, in the plan's order, so no share
/// exceeds another by more than its largest copy. Every copy lands in exactly one share; empty
/// shares are left out (a plan of one copy is one share).
pub(crate) fn spread(plan: CopyPlan, shares: usize, share_bytes_min: u64) -> Vec<CopyPlan> {
    if shares <= 1 {
        // The default shape (one copy stream): no byte count to make.
        return vec![plan];
    }
    let total = plan.strided.iter().map(Strided::bytes).sum::<u64>() + plan.flat.iter().map(|f| f.2).sum::<u64>();
    let by_bytes = usize::try_from(total / share_bytes_min.max(1)).unwrap_or(usize::MAX);
    let shares = shares.min(by_bytes).clamp(1, (plan.strided.len() + plan.flat.len()).max(1));
    if shares == 1 {
        return vec![plan];
    }
    let mut out = vec![CopyPlan::default(); shares];
    let mut bytes = vec![0u64; shares];
    let lightest = |bytes: &[u64]| (0..bytes.len()).min_by_key(|&i| bytes[i]).unwrap_or(0);
    for copy in plan.strided {
        let i = lightest(&bytes);
        bytes[i] += copy.bytes();
        out[i].strided.push(copy);
    }
    for piece in plan.flat {
        let i = lightest(&bytes);
        bytes[i] += piece.2;
        out[i].flat.push(piece);
    }
    out.retain(|p| !p.strided.is_empty() || !p.flat.is_empty());
    out
}

/// Where a plan's copies are queued (one stream: they all complete before the event recorded
/// after them).
pub(crate) trait CopySink {
    /// Queues flat pieces `(dst, src, len)` in as few calls as it can; returns the calls taken.
    fn copy_flat(&mut self, pieces: &[(u64, u64, u64)]) -> Result<usize, String>;
    /// Queues one 2D copy.
    fn copy_2d(&mut self, copy: &Strided) -> Result<(), String>;
    /// Queues many 2D copies in as few calls as it can; returns the calls taken, or how many
    /// copies it queued before it failed and why.
    fn copy_2d_batch(&mut self, copies: &[Strided]) -> Result<usize, (usize, String)>;
}

/// What [`issue`] queued.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Issued {
    /// Driver calls for the flat pieces.
    pub(crate) flat_calls: usize,
    /// 2D copies queued as such.
    pub(crate) strided: usize,
    /// Driver calls for those 2D copies (fewer than `strided` when batched).
    pub(crate) strided_calls: usize,
    /// 2D copies the sink refused and that went row by row as flat pieces instead.
    pub(crate) strided_as_rows: usize,
}

/// Queues `plan` on `sink`: every 2D copy (with `batch_2d`, in batched calls first; what a batch
/// did not queue goes one copy a call), then the flat pieces. A 2D copy the sink refuses (a
/// driver that rejects the pitches, say) goes again as its rows, flat, so a refusal costs speed,
/// never bytes; an error of the flat path is the batch's error.
pub(crate) fn issue(plan: &CopyPlan, sink: &mut dyn CopySink, batch_2d: bool) -> Result<Issued, String> {
    let mut issued = Issued::default();
    issue_into(plan, sink, batch_2d, &mut issued)?;
    Ok(issued)
}

/// [`issue`], adding to `issued` (a streamed write's running total): a 2D copy refused is logged
/// once a write, when `issued` has no refusal yet, not once a step.
fn issue_into(plan: &CopyPlan, sink: &mut dyn CopySink, batch_2d: bool, issued: &mut Issued) -> Result<(), String> {
    let mut rest: &[Strided] = &plan.strided;
    if batch_2d && rest.len() >= 2 {
        match sink.copy_2d_batch(rest) {
            Ok(calls) => {
                issued.strided += rest.len();
                issued.strided_calls += calls;
                rest = &[];
            }
            Err((queued, reason)) => {
                tracing::warn!(error = %reason, queued, of = rest.len(), "batched 2D copies refused; the rest go one call each");
                issued.strided += queued;
                rest = &rest[queued.min(rest.len())..];
            }
        }
    }
    let mut rows: Vec<(u64, u64, u64)> = vec![];
    for copy in rest {
        match sink.copy_2d(copy) {
            Ok(()) => {
                issued.strided += 1;
                issued.strided_calls += 1;
            }
            Err(reason) => {
                if issued.strided_as_rows == 0 {
                    tracing::warn!(error = %reason, ?copy, "2D copy refused; its rows go as 1D copies");
                }
                issued.strided_as_rows += 1;
                rows.extend(copy.rows());
            }
        }
    }
    if !plan.flat.is_empty() {
        issued.flat_calls += sink.copy_flat(&plan.flat)?;
    }
    if !rows.is_empty() {
        issued.flat_calls += sink.copy_flat(&rows)?;
    }
    Ok(())
}

/// One stream of a spread write as [`issue_spread`] drives it: a [`CopySink`] that can also mark
/// the end of what it has queued (an event) and wait, on the device, for another lane's mark.
pub(crate) trait SpreadLane: CopySink {
    /// A point in a lane's queue (a CUDA event).
    type Mark;
    /// Marks the end of what this lane has queued so far.
    fn mark(&mut self) -> Result<Self::Mark, String>;
    /// Holds this lane's later work until `mark` (another lane's) is reached.
    fn wait_for(&mut self, mark: &Self::Mark) -> Result<(), String>;
}

/// How [`issue_spread`] failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SpreadError {
    pub(crate) reason: String,
    /// A lane's copies may still run unjoined: the first lane's end no longer covers them, so
    /// the memory they touch must never be released (it is leaked instead).
    pub(crate) untracked: bool,
}

/// Queues `shares[i]` on `lanes[i]` so that the end of the first lane covers every copy: the
/// other lanes first wait for the first lane's mark (each share starts where a single stream's
/// copies would), and after the shares the first waits for each other lane's mark. A share that
/// fails part-way is still joined (what it queued runs, and the caller holds the memory until
/// the first lane's end); a join that fails leaves that lane untracked.
pub(crate) fn issue_spread<L: SpreadLane>(
    lanes: &mut [L],
    shares: &[CopyPlan],
    batch_2d: bool,
) -> Result<(), SpreadError> {
    let untracked = |reason: String, untracked: bool| SpreadError { reason, untracked };
    if lanes.len() != shares.len() {
        return Err(untracked(format!("{} shares for {} copy streams", shares.len(), lanes.len()), false));
    }
    let Some((first, others)) = lanes.split_first_mut() else { return Ok(()) };
    if !others.is_empty() {
        // Nothing is queued yet: a failure here leaves nothing running.
        let fork = first.mark().map_err(|e| untracked(e, false))?;
        for lane in others.iter_mut() {
            lane.wait_for(&fork).map_err(|e| untracked(e, false))?;
        }
    }
    let mut failure = issue(&shares[0], first, batch_2d).err();
    for (lane, share) in others.iter_mut().zip(&shares[1..]) {
        if let Err(e) = issue(share, lane, batch_2d) {
            failure.get_or_insert(e);
        }
    }
    let mut lost = false;
    for lane in others.iter_mut() {
        if let Err(e) = lane.mark().and_then(|m| first.wait_for(&m)) {
            lost = true;
            failure.get_or_insert(e);
        }
    }
    failure.map_or(Ok(()), |e| Err(untracked(e, lost)))
}

#[cfg(test)]
pub(crate) mod tests;
