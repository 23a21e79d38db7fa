//! The order of a direct all_reduce's reductions.
//!
//! Why a fixed order: a floating-point sum depends on the order of its terms, and data-parallel
//! training needs every rank to end with the same bits (DDP's replicas would drift apart
//! otherwise). So every rank combines the same inputs in rank order, `((x0 op x1) op x2) ...`,
//! taking its own contribution from its send buffer and the others from its inbox.

use accord_cuda::ReduceOp;

/// Where one operand of a reduction step comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// The caller's send buffer (this rank's contribution).
    Own,
    /// Rank `r`'s contribution, pushed into this rank's inbox.
    Inbox(usize),
    /// This rank's contribution, copied into its own inbox slot first: in place, from rank 2 on,
    /// the first step overwrites the send buffer before the chain reaches this rank's term.
    Staged,
    /// The receive buffer, holding the chain so far.
    Result,
}

/// One reduction: `recv = a op b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// First operand.
    pub a: Input,
    /// Second operand.
    pub b: Input,
    /// The operation (an average divides only in the last step).
    pub op: ReduceOp,
}

/// Whether rank `me` of `n` stages its contribution before reducing (see [`Input::Staged`]).
pub fn stages_own(n: usize, me: usize, in_place: bool) -> bool {
    in_place && n > 2 && me >= 2
}

/// The reduction steps of rank `me` of `n` (at least 2 ranks) for `op`.
pub fn steps(n: usize, me: usize, op: ReduceOp, in_place: bool) -> Vec<Step> {
    assert!(n >= 2 && me < n, "a direct all_reduce needs 2 or more ranks (rank {me} of {n})");
    let term = |r: usize| match (r == me, stages_own(n, me, in_place)) {
        (true, true) => Input::Staged,
        (true, false) => Input::Own,
        (false, _) => Input::Inbox(r),
    };
    // Every step but the last accumulates; an average divides once, at the end.
    let partial = match op {
        ReduceOp::Avg { .. } => ReduceOp::Sum,
        other => other,
    };
    let op_of = |k: usize| if k == n - 1 { op } else { partial };
    let mut out = vec![Step { a: term(0), b: term(1), op: op_of(1) }];
    for k in 2..n {
        out.push(Step { a: Input::Result, b: term(k), op: op_of(k) });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_ranks_reduce_once_in_rank_order() {
        let avg = ReduceOp::Avg { divisor: 2 };
        assert_eq!(steps(2, 0, avg, false), vec![Step { a: Input::Own, b: Input::Inbox(1), op: avg }]);
        assert_eq!(steps(2, 1, avg, true), vec![Step { a: Input::Inbox(0), b: Input::Own, op: avg }]);
    }

    #[test]
    fn every_rank_combines_the_same_terms_in_the_same_order() {
        for n in 2..6 {
            for me in 0..n {
                for in_place in [false, true] {
                    let got = steps(n, me, ReduceOp::Max, in_place);
                    assert_eq!(got.len(), n - 1);
                    // Resolve each operand to the rank whose data it holds.
                    let rank_of = |i: Input| match i {
                        Input::Own | Input::Staged => Some(me),
                        Input::Inbox(r) => Some(r),
                        Input::Result => None,
                    };
                    assert_eq!((rank_of(got[0].a), rank_of(got[0].b)), (Some(0), Some(1)));
                    for (k, step) in got.iter().enumerate().skip(1) {
                        assert_eq!((step.a, rank_of(step.b)), (Input::Result, Some(k + 1)));
                    }
                }
            }
        }
    }

    #[test]
    fn in_place_the_own_term_is_staged_only_where_the_first_step_would_overwrite_it() {
        assert!(!stages_own(2, 1, true));
        assert!(!stages_own(3, 1, true), "rank 1's term is read by the first step itself");
        assert!(stages_own(3, 2, true));
        assert!(!stages_own(3, 2, false));
        assert!(steps(4, 3, ReduceOp::Sum, true).iter().any(|s| s.b == Input::Staged));
        assert!(!steps(4, 3, ReduceOp::Sum, true).iter().any(|s| s.a == Input::Own || s.b == Input::Own));
    }

    #[test]
    fn an_average_sums_until_the_last_step() {
        let got = steps(4, 0, ReduceOp::Avg { divisor: 4 }, false);
        let ops: Vec<ReduceOp> = got.iter().map(|s| s.op).collect();
        assert_eq!(ops, vec![ReduceOp::Sum, ReduceOp::Sum, ReduceOp::Avg { divisor: 4 }]);
    }
}
