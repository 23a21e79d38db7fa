//! CUDA graphs: the work a closure queues on a stream is captured once and replayed with one
//! call, the way applications run device-initiated communication kernels inside their own
//! graphs (a kernel that puts, signals and waits must behave the same when replayed).

use crate::context::Gpu;
use crate::error::Result;
use crate::ffi::driver::{self, RawGraphExec};
use crate::stream::Stream;

/// An instantiated graph of one GPU; destroyed on drop.
#[derive(Debug)]
pub struct Graph {
    gpu: Gpu,
    exec: RawGraphExec,
}

impl Graph {
    /// Captures what `record` queues on `stream` (kernel launches, copies, event records) into
    /// a graph and instantiates it. Nothing runs during the capture. The capture is
    /// thread-local: other threads keep using CUDA meanwhile. If `record` fails, the capture
    /// is ended, its graph dropped, and `record`'s error returned; the stream is usable again.
    pub fn capture(stream: &Stream, record: impl FnOnce(&Stream) -> Result<()>) -> Result<Graph> {
        let gpu = stream.gpu().clone();
        gpu.bind()?;
        driver::stream_begin_capture(stream.raw())?;
        let recorded = record(stream);
        // `record` may have bound another context; the capture ends in the stream's.
        let bound = gpu.bind();
        let ended = driver::stream_end_capture(stream.raw());
        let graph = match (recorded, bound, ended) {
            (Ok(()), Ok(()), Ok(graph)) => graph,
            (recorded, bound, ended) => {
                if let Ok(graph) = ended {
                    let _ = driver::graph_destroy(graph);
                }
                recorded?;
                bound?;
                return Err(crate::error::CudaError::InvalidArgument {
                    what: "the stream capture ended without a graph".into(),
                });
            }
        };
        let exec = driver::graph_instantiate(graph);
        let _ = driver::graph_destroy(graph);
        Ok(Graph { gpu, exec: exec? })
    }

    /// Queues one replay of the whole graph on `stream` (a stream of the same GPU).
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        if !stream.gpu().same_device(&self.gpu) {
            return Err(crate::error::CudaError::InvalidArgument {
                what: "a graph is launched on a stream of the GPU it was captured on".into(),
            });
        }
        self.gpu.bind()?;
        driver::graph_launch(self.exec, stream.raw())
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Ok(_restore) = self.gpu.bind_scoped() {
            let _ = driver::graph_exec_destroy(self.exec);
        }
    }
}
