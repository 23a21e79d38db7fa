//! The staging buffers of `accord.Communicator`'s calls that cannot run on the caller's own
//! memory (read-only arrays, overlapping input and output): registered once, reused, grown when
//! a call needs more; a copy in and, where results come back, a copy out.

use accord_coll::{Bufs, CollError, CollTransport, Communicator, LocalBuf};

/// Runs `f` in place on a copy of `data` in the communicator's registered staging buffer
/// (registered once, reused by later calls) and returns the result's bytes.
pub(crate) fn in_place<T: CollTransport>(
    comm: &mut Communicator<T>,
    mut data: Vec<u8>,
    f: impl FnOnce(&mut Communicator<T>, Bufs<'_>) -> Result<(), CollError>,
) -> Result<Vec<u8>, CollError> {
    comm.run_staged(&mut data, f)?;
    Ok(data)
}

/// Registered buffers kept between out-of-place calls, so that a call costs two copies and no
/// registration; each grows (re-registered) when a call needs more.
#[derive(Default)]
pub(crate) struct Staging {
    input: Option<LocalBuf>,
    output: Option<LocalBuf>,
}

impl Staging {
    /// Gives the buffers back to `comm` (a communicator handed over to another owner), best
    /// effort: one that fails to deregister stays registered until `comm` is dropped.
    pub(crate) fn deregister<T: CollTransport>(self, comm: &Communicator<T>) {
        for buf in [self.input, self.output].into_iter().flatten() {
            let _ = comm.deregister(buf);
        }
    }
}

/// `slot`'s buffer if it holds `len` bytes, else a new registered one of at least `len`.
fn staged<T: CollTransport>(
    comm: &Communicator<T>,
    slot: &mut Option<LocalBuf>,
    len: usize,
) -> Result<LocalBuf, CollError> {
    match slot.take() {
        Some(buf) if buf.len() >= len => Ok(buf),
        old => {
            if let Some(old) = old {
                comm.deregister(old)?;
            }
            comm.register(vec![0u8; len.max(4096).next_power_of_two()])
        }
    }
}

/// Copies `input` (and, with `output_in`, `output`) into the staging buffers, runs `f` on
/// them, and returns the output's bytes. The buffers go back into `staging` on success; after
/// a failure (the communicator is then unusable) they stay registered until it is dropped.
pub(crate) fn out_of_place<T: CollTransport>(
    comm: &mut Communicator<T>,
    staging: &mut Staging,
    input: Vec<u8>,
    mut output: Vec<u8>,
    output_in: bool,
    f: impl FnOnce(&mut Communicator<T>, Bufs<'_>) -> Result<(), CollError>,
) -> Result<Vec<u8>, CollError> {
    let transport = |collective: &'static str| move |source| CollError::Transport { collective, source };
    let send = staged(comm, &mut staging.input, input.len())?;
    let recv = staged(comm, &mut staging.output, output.len())?;
    let (s, r) = (send.slice(0, input.len()), recv.slice(0, output.len()));
    comm.transport().write_local(s, &input).map_err(transport("staging"))?;
    if output_in {
        comm.transport().write_local(r, &output).map_err(transport("staging"))?;
    }
    f(comm, Bufs { send: s, recv: r })?;
    comm.transport().read_local(r, &mut output).map_err(transport("staging"))?;
    staging.input = Some(send);
    staging.output = Some(recv);
    Ok(output)
}
