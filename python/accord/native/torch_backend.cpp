// accord.torch's compiled backend: the all_reduce that a DDP step calls at every bucket, FSDP's
// all_gather_into_tensor and reduce_scatter_tensor on CUDA, and synchronous CPU all_reduce,
// all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single, run without Python;
// every other case goes to the Python backend.
//
// Why: torch reaches a Python process group through Python at every op, and a CUDA-aware
// future made in Python finds its tensors by pickling its value. A DDP step pays both at every
// bucket on its autograd thread, which bound the 2-GPU step (docs/results/
// 2026-11-27-direct-gpu-calls.md), and they are most of a small CPU op's cost
// (docs/results/2026-11-27-torch-floors-and-binding-cost.md).
//
// How it fits: accord.torch's process group (Python) leaves `allreduce`, `_allgather_base`,
// `_reduce_scatter_base` and `alltoall_base` to torch's C++ base, which dispatches to the
// backend registered for the tensor's device: this one. It calls accord's Rust functions
// directly (accord_torch_api.h), with no GIL, where it can:
//  - CUDA tensors (all_reduce, all_gather, reduce_scatter), once the group's GPU collectives
//    run on a stream of the group's own: the op is queued there behind the caller's stream, its
//    end a mark; the handle waits on the mark and its future is a C++ CUDA-aware future;
//  - CPU tensors in a synchronous call, already registered, with no op of the group queued or
//    running: the op runs here and now. The Python backend counts its ops in a word this file
//    reads (`words`, below), and its communicator makes a Python op that finds this one
//    running wait its turn (Communicator._set_wait_turn).
// Anything else (the first call on a tensor, async CPU calls, other dtypes or layouts, sizes
// that do not match, a pending point-to-point batch) is handed to the Python backend's method
// for the op (`in_python`), which registers, queues, stages or refuses with a clear error.
// _torch_native.py builds this file against the torch that imports it.

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/python.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "accord_torch_api.h"

namespace py = pybind11;

namespace {

// The name accord's Rust side parses, or nullptr for an op it does not run.
const char* reduce_name(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return "sum";
    case c10d::ReduceOp::PRODUCT:
      return "prod";
    case c10d::ReduceOp::MIN:
      return "min";
    case c10d::ReduceOp::MAX:
      return "max";
    case c10d::ReduceOp::AVG:
      return "avg";
    default:
      return nullptr;
  }
}

// The element type's name, or nullptr for one this path leaves to Python. The GPU collectives
// reduce five types (accord.torch's _GPU_REDUCE_DTYPES), the host ones eight.
const char* dtype_name(c10::ScalarType type, bool gpu) {
  switch (type) {
    case c10::ScalarType::Float:
      return "float32";
    case c10::ScalarType::Half:
      return "float16";
    case c10::ScalarType::BFloat16:
      return "bfloat16";
    case c10::ScalarType::Int:
      return "int32";
    case c10::ScalarType::Long:
      return "int64";
    case c10::ScalarType::Double:
      return gpu ? nullptr : "float64";
    case c10::ScalarType::Char:
      return gpu ? nullptr : "int8";
    case c10::ScalarType::Byte:
      return gpu ? nullptr : "uint8";
    default:
      return nullptr;
  }
}

// A tensor the fast paths take as it is: dense, contiguous, not empty, no lazy conjugate or
// negation.
bool plain(const at::Tensor& t) {
  return t.layout() == c10::kStrided && t.numel() > 0 && t.is_contiguous() && !t.is_conj() &&
         !t.is_neg();
}

// An op's output and input, taken as they are: both plain, of one dtype, on one device.
bool plain_pair(const at::Tensor& output, const at::Tensor& input) {
  return plain(output) && plain(input) && output.scalar_type() == input.scalar_type() &&
         output.device() == input.device();
}

size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

uint64_t address(const at::Tensor& t) { return reinterpret_cast<uint64_t>(t.data_ptr()); }

// Drops a Python reference from any thread: with the GIL, or not at all once the interpreter
// is gone (a backend freed at exit).
void drop_reference(py::object& object) {
  if (!object) {
    return;
  }
  if (Py_IsInitialized()) {
    py::gil_scoped_acquire gil;
    object = py::object();
  } else {
    object.release();
  }
}

// Releases the GIL for a scope where the calling thread holds it, else does nothing. torch's
// trampoline for a Python process group calls the C++ allreduce with the GIL held (it looked
// for a Python override first); a collective waiting for its peers with it held would stall
// this process's other threads, and with them ranks whose progress needs those threads.
class WithoutGil {
 public:
  WithoutGil() : state_(PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  WithoutGil(const WithoutGil&) = delete;
  WithoutGil& operator=(const WithoutGil&) = delete;
  ~WithoutGil() {
    if (state_ != nullptr) {
      PyEval_RestoreThread(state_);
    }
  }

 private:
  PyThreadState* state_;
};

// The accord.errors exception a failed call names, as the Python path raises it (GIL held).
py::object failure_exception(const accord_failure& failure) {
  py::object errors = py::module_::import("accord.errors");
  py::object cls = py::getattr(errors, failure.class_name, errors.attr("AccordError"));
  return cls(py::str(failure.message));
}

// Raises the accord.errors exception a failed call names.
[[noreturn]] void raise_failure(const accord_failure& failure) {
  py::gil_scoped_acquire gil;
  py::object error = failure_exception(failure);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

c10::Stream current_stream(c10::Device device) {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device);
}

uint64_t raw(const c10::Stream& stream) {
  return reinterpret_cast<uint64_t>(stream.native_handle());
}

// A group's GPU collectives, as the Python backend set them up: the communicator (kept alive
// by `keep`), the group's stream and its device.
struct GpuPath {
  const accord_torch_api* api;
  uintptr_t comm;
  py::object keep;
  c10::Stream side;
  uint64_t side_raw;
  size_t bytes_max;

  GpuPath(const accord_torch_api* api, uintptr_t comm, py::object keep, c10::Stream side,
          uint64_t side_raw, size_t bytes_max)
      : api(api), comm(comm), keep(std::move(keep)), side(side), side_raw(side_raw),
        bytes_max(bytes_max) {}
  GpuPath(const GpuPath&) = delete;
  GpuPath& operator=(const GpuPath&) = delete;
  ~GpuPath() { drop_reference(keep); }

  c10::Device device() const { return side.device(); }

  // The first failure of the group's GPU collectives, if any.
  bool failed(accord_failure& failure) const {
    WithoutGil released;  // the check waits for a call of another thread that holds the queue
    return api->gpu_check(comm, &failure) != ACCORD_DONE;
  }
};

// A future holding `result`, complete now; on CUDA, in the order of the current stream (the
// caller sets it), as a CUDA-aware future records it.
c10::intrusive_ptr<c10::ivalue::Future> completed_future(const std::vector<at::Tensor>& result,
                                                         std::vector<c10::Device> devices) {
  auto future = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), std::move(devices));
  future->markCompleted(c10::IValue(result));
  return future;
}

// The handle of an op queued on the group's stream: its end is a mark (a counter the stream
// stores into pinned memory), as accord.torch's _MarkedWork.
class MarkedWork : public c10d::Work {
 public:
  MarkedWork(std::shared_ptr<const GpuPath> gpu, uint64_t mark, std::vector<at::Tensor> result,
             int rank, c10d::OpType type)
      : c10d::Work(rank, type), gpu_(std::move(gpu)), mark_(mark),
        result_(std::move(result)) {}

  bool isCompleted() override {
    int32_t reached = 0;
    accord_failure failure{};
    int32_t code;
    {
      WithoutGil released;
      code = gpu_->api->gpu_mark_reached(gpu_->comm, mark_, &reached, &failure);
    }
    if (code != ACCORD_DONE) {
      return true;  // failed: done, and wait() says why
    }
    return reached != 0;
  }

  bool isSuccess() const override {
    accord_failure failure{};
    return !gpu_->failed(failure);
  }

  std::exception_ptr exception() const override {
    accord_failure failure{};
    if (!gpu_->failed(failure)) {
      return nullptr;
    }
    return std::make_exception_ptr(std::runtime_error(failure.message));
  }

  // Work.exception() for Python callers (torch's binding cannot return an exception_ptr): the
  // accord.errors exception of the group's GPU collectives' first failure, or None.
  py::object exception_object() const {
    accord_failure failure{};
    if (!gpu_->failed(failure)) {
      return py::none();
    }
    return failure_exception(failure);
  }

  // Makes the caller's current stream wait for the op (as NCCL's work does).
  bool wait(std::chrono::milliseconds /*timeout: the op's own deadline bounds it*/) override {
    accord_failure failure{};
    if (gpu_->failed(failure)) {
      raise_failure(failure);
    }
    uint64_t stream = raw(current_stream(gpu_->device()));
    int32_t code;
    {
      WithoutGil released;
      code = gpu_->api->gpu_wait_mark(gpu_->comm, stream, mark_, &failure);
    }
    if (code != ACCORD_DONE) {
      raise_failure(failure);
    }
    return true;
  }

  std::vector<at::Tensor> result() override { return result_; }

  // A CUDA-aware future, complete in the order of the group's stream, made when first asked
  // for (DDP asks at every bucket; plain calls never do).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(future_mutex_);
    if (!future_) {
      c10::StreamGuard on_side(gpu_->side);
      future_ = completed_future(result_, {gpu_->device()});
    }
    return future_;
  }

 private:
  std::shared_ptr<const GpuPath> gpu_;
  uint64_t mark_;
  std::vector<at::Tensor> result_;
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The handle of a host op that ran on the calling thread: done at return.
class DoneWork : public c10d::Work {
 public:
  DoneWork(std::vector<at::Tensor> result, int rank, c10d::OpType type)
      : c10d::Work(rank, type), result_(std::move(result)) {}

  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  py::object exception_object() const { return py::none(); }
  bool wait(std::chrono::milliseconds) override { return true; }
  std::vector<at::Tensor> result() override { return result_; }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(future_mutex_);
    if (!future_) {
      future_ = completed_future(result_, {});
    }
    return future_;
  }

 private:
  std::vector<at::Tensor> result_;
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A handle of the Python backend (its Work) seen from C++: every call goes to the Python
// object's method of the same name, as a Python caller's would (torch's C++ Work does not route
// is_completed or exception to a Python subclass), and the object lives as long as this.
class PythonWork : public c10d::Work {
 public:
  PythonWork(py::object work, c10d::OpType type) : c10d::Work(-1, type), work_(std::move(work)) {}
  PythonWork(const PythonWork&) = delete;
  PythonWork& operator=(const PythonWork&) = delete;
  ~PythonWork() override { drop_reference(work_); }

  bool isCompleted() override {
    py::gil_scoped_acquire gil;
    return work_.attr("is_completed")().cast<bool>();
  }

  bool isSuccess() const override {
    py::gil_scoped_acquire gil;
    return work_.attr("is_success")().cast<bool>();
  }

  std::exception_ptr exception() const override {
    py::gil_scoped_acquire gil;
    py::object error = work_.attr("exception")();
    if (error.is_none()) {
      return nullptr;
    }
    return std::make_exception_ptr(std::runtime_error(py::str(error).cast<std::string>()));
  }

  bool wait(std::chrono::milliseconds timeout) override {
    py::gil_scoped_acquire gil;
    py::object limit = py::none();
    if (timeout.count() > 0) {  // 0: none given (torch's kNoTimeout)
      limit = py::module_::import("datetime").attr("timedelta")(py::arg("milliseconds") = timeout.count());
    }
    return work_.attr("wait")(limit).cast<bool>();
  }

  std::vector<at::Tensor> result() override {
    py::gil_scoped_acquire gil;
    return work_.attr("result")().cast<std::vector<at::Tensor>>();
  }

  py::object exception_object() const { return work_.attr("exception")(); }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    py::gil_scoped_acquire gil;
    py::object future = work_.attr("get_future")();
    return future.cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>()->fut;
  }

 private:
  py::object work_;
};

class AccordNative : public c10d::Backend {
 public:
  // `words`: a writable buffer of two int64 the Python backend keeps (an array.array): [0] its
  // ops queued or running, [1] nonzero while point-to-point ops wait to be batched.
  AccordNative(int rank, int size, py::object group_ref, uintptr_t api, py::object host_comm,
               py::object words)
      : c10d::Backend(rank, size), group_ref_(std::move(group_ref)),
        api_(reinterpret_cast<const accord_torch_api*>(api)), host_keep_(std::move(host_comm)),
        words_keep_(std::move(words)) {
    if (api_ == nullptr || api_->abi != ACCORD_TORCH_ABI) {
      throw std::runtime_error(
          "accord backend: the compiled backend and accord's module disagree on their interface: "
          "rebuild it (delete the accord torch-native cache)");
    }
    host_comm_ = host_keep_.attr("_native_handle")().cast<uintptr_t>();
    // The export is kept for the backend's life: the buffer cannot be resized or moved.
    words_view_ = std::make_unique<py::buffer_info>(py::buffer(words_keep_).request(true));
    if (words_view_->itemsize != 8 || words_view_->size < 2) {
      throw std::runtime_error("accord backend: words must be a writable buffer of two int64");
    }
    words_ = static_cast<int64_t*>(words_view_->ptr);
  }

  ~AccordNative() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      words_view_.reset();
    } else {
      (void)words_view_.release();  // the interpreter is gone: nothing to give back to
    }
    drop_reference(group_ref_);
    drop_reference(host_keep_);
    drop_reference(words_keep_);
  }

  const std::string getBackendName() const override { return "accord"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (tensors.size() == 1 && word(kP2pPending) == 0) {
      if (auto work = native_all_reduce(tensors, opts)) {
        return work;
      }
    }
    return in_python("_allreduce_python", "all_reduce", c10d::OpType::ALLREDUCE, tensors, opts);
  }

  // all_gather_into_tensor.
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    if (word(kP2pPending) == 0) {
      if (auto work = native_all_gather(output, input, opts)) {
        return work;
      }
    }
    return in_python("_all_gather_single_python", "all_gather_into_tensor",
                     c10d::OpType::_ALLGATHER_BASE, output, input, opts);
  }

  // reduce_scatter_tensor.
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts)
      override {
    if (word(kP2pPending) == 0) {
      if (auto work = native_reduce_scatter(output, input, opts)) {
        return work;
      }
    }
    return in_python("_reduce_scatter_single_python", "reduce_scatter_tensor",
                     c10d::OpType::_REDUCE_SCATTER_BASE, output, input, opts);
  }

  // all_to_all_single.
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    if (word(kP2pPending) == 0) {
      if (auto work = native_all_to_all(output, input, output_splits, input_splits, opts)) {
        return work;
      }
    }
    return in_python("_all_to_all_single_python", "all_to_all_single", c10d::OpType::ALLTOALL_BASE,
                     output, input, output_splits, input_splits, opts);
  }

  // The Python backend's GPU collectives, once it set them up with a stream of its own.
  void set_gpu(py::object comm, int64_t stream_id, int64_t device_index, int64_t device_type,
               uint64_t side_raw, size_t bytes_max) {
    auto handle = comm.attr("_native_handle")().cast<uintptr_t>();
    auto side = c10::Stream::unpack3(stream_id, static_cast<c10::DeviceIndex>(device_index),
                                     static_cast<c10::DeviceType>(device_type));
    auto gpu = std::make_shared<const GpuPath>(api_, handle, std::move(comm), side, side_raw,
                                               bytes_max);
    std::lock_guard<std::mutex> lock(gpu_mutex_);
    gpu_ = std::move(gpu);
  }

  // (GPU ops, host ops) this backend ran without Python, and the calls it raised an error
  // from: for tests and probes.
  std::pair<uint64_t, uint64_t> native_ops() const {
    return {gpu_ops_.load(std::memory_order_relaxed), host_ops_.load(std::memory_order_relaxed)};
  }
  uint64_t native_failures() const { return failures_.load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<const GpuPath> gpu_path() {
    std::lock_guard<std::mutex> lock(gpu_mutex_);
    return gpu_;
  }

  c10::intrusive_ptr<c10d::Work> native_all_reduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::AllreduceOptions& opts) {
    const at::Tensor& t = tensors[0];
    const char* op = reduce_name(opts.reduceOp);
    if (op == nullptr || !plain(t)) {
      return {};
    }
    if (t.is_cuda()) {
      auto gpu = gpu_path();
      const char* dtype = dtype_name(t.scalar_type(), true);
      if (!gpu || dtype == nullptr || t.device() != gpu->device() || nbytes(t) > gpu->bytes_max) {
        return {};
      }
      const GpuPath& g = *gpu;
      return queue_on_gpu(std::move(gpu), tensors, {t}, c10d::OpType::ALLREDUCE,
                          [&](uint64_t after, uint64_t* mark, accord_failure* failure) {
                            return g.api->gpu_all_reduce(g.comm, address(t),
                                                         static_cast<size_t>(t.numel()), dtype,
                                                         op, g.side_raw, after, mark, failure);
                          });
    }
    const char* dtype = dtype_name(t.scalar_type(), false);
    if (!t.is_cpu() || opts.asyncOp || dtype == nullptr) {
      return {};
    }
    return run_on_host(tensors, c10d::OpType::ALLREDUCE, [&](accord_failure* failure) {
      return api_->host_all_reduce(host_comm_, address(t), nbytes(t), dtype, op, failure);
    });
  }

  c10::intrusive_ptr<c10d::Work> native_all_gather(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) {
    // The eight dtypes the Python path takes, on either device (it refuses the rest clearly).
    const char* dtype = dtype_name(output.scalar_type(), false);
    if (dtype == nullptr || !plain_pair(output, input) ||
        output.numel() != input.numel() * getSize()) {
      return {};
    }
    std::vector<at::Tensor> result{output};
    if (output.is_cuda()) {
      auto gpu = gpu_path();
      if (!gpu || output.device() != gpu->device() || nbytes(output) > gpu->bytes_max) {
        return {};
      }
      const GpuPath& g = *gpu;
      return queue_on_gpu(std::move(gpu), std::move(result), {input, output},
                          c10d::OpType::_ALLGATHER_BASE,
                          [&](uint64_t after, uint64_t* mark, accord_failure* failure) {
                            return g.api->gpu_all_gather(g.comm, address(input), address(output),
                                                         nbytes(input), g.side_raw, after, mark,
                                                         failure);
                          });
    }
    if (!output.is_cpu() || opts.asyncOp) {
      return {};
    }
    return run_on_host(std::move(result), c10d::OpType::_ALLGATHER_BASE,
                       [&](accord_failure* failure) {
                         return api_->host_all_gather(host_comm_, address(input), address(output),
                                                      nbytes(input), dtype, failure);
                       });
  }

  c10::intrusive_ptr<c10d::Work> native_reduce_scatter(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts) {
    const char* op = reduce_name(opts.reduceOp);
    if (op == nullptr || !plain_pair(output, input) ||
        input.numel() != output.numel() * getSize()) {
      return {};
    }
    std::vector<at::Tensor> result{output};
    if (output.is_cuda()) {
      auto gpu = gpu_path();
      const char* dtype = dtype_name(output.scalar_type(), true);
      if (!gpu || dtype == nullptr || output.device() != gpu->device() ||
          nbytes(output) > gpu->bytes_max) {
        return {};
      }
      const GpuPath& g = *gpu;
      return queue_on_gpu(std::move(gpu), std::move(result), {input, output},
                          c10d::OpType::_REDUCE_SCATTER_BASE,
                          [&](uint64_t after, uint64_t* mark, accord_failure* failure) {
                            return g.api->gpu_reduce_scatter(
                                g.comm, address(input), address(output),
                                static_cast<size_t>(output.numel()), dtype, op, g.side_raw, after,
                                mark, failure);
                          });
    }
    const char* dtype = dtype_name(output.scalar_type(), false);
    if (!output.is_cpu() || opts.asyncOp || dtype == nullptr) {
      return {};
    }
    return run_on_host(std::move(result), c10d::OpType::_REDUCE_SCATTER_BASE,
                       [&](accord_failure* failure) {
                         return api_->host_reduce_scatter(host_comm_, address(input),
                                                          address(output), nbytes(output), dtype,
                                                          op, failure);
                       });
  }

  // CPU tensors only: the GPU all_to_all takes even splits, which the Python path checks.
  c10::intrusive_ptr<c10d::Work> native_all_to_all(at::Tensor& output, at::Tensor& input,
                                                   const std::vector<int64_t>& output_splits,
                                                   const std::vector<int64_t>& input_splits,
                                                   const c10d::AllToAllOptions& opts) {
    const char* dtype = dtype_name(output.scalar_type(), false);
    if (dtype == nullptr || !plain_pair(output, input) || !output.is_cpu() || opts.asyncOp) {
      return {};
    }
    std::vector<uint64_t> send;
    std::vector<uint64_t> recv;
    if (!element_counts(input, input_splits, send) ||
        !element_counts(output, output_splits, recv)) {
      return {};
    }
    std::vector<at::Tensor> result{output};
    return run_on_host(std::move(result), c10d::OpType::ALLTOALL_BASE,
                       [&](accord_failure* failure) {
                         return api_->host_all_to_allv(host_comm_, address(input), nbytes(input),
                                                       address(output), nbytes(output), dtype,
                                                       send.data(), recv.data(), send.size(),
                                                       failure);
                       });
  }

  // The elements each rank's block of `t` holds: `splits` rows of its first dimension each
  // (none given: an even split), as the Python path counts them; false where they do not add
  // up (the Python path then says what is wrong).
  bool element_counts(const at::Tensor& t, const std::vector<int64_t>& splits,
                      std::vector<uint64_t>& counts) const {
    const int64_t size = getSize();
    const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    if (rows <= 0) {
      return false;
    }
    const int64_t row = t.numel() / rows;
    counts.clear();
    if (splits.empty()) {
      if (rows % size != 0) {
        return false;
      }
      counts.assign(static_cast<size_t>(size), static_cast<uint64_t>(rows / size * row));
      return true;
    }
    if (static_cast<int64_t>(splits.size()) != size) {
      return false;
    }
    int64_t total = 0;
    for (int64_t s : splits) {
      if (s < 0 || s > rows) {
        return false;
      }
      total += s;
      counts.push_back(static_cast<uint64_t>(s * row));
    }
    return total == rows;
  }

  // Queues an op on the group's stream behind the caller's current one (`queue(after, &mark,
  // &failure)`), and tells the caching allocator `touched` are in use there: their memory is not
  // handed out again before the group's stream is done with it, whether or not the caller waits.
  template <typename Queue>
  c10::intrusive_ptr<c10d::Work> queue_on_gpu(std::shared_ptr<const GpuPath> gpu,
                                              std::vector<at::Tensor> result,
                                              std::initializer_list<at::Tensor> touched,
                                              c10d::OpType type, Queue queue) {
    uint64_t after = raw(current_stream(gpu->device()));
    uint64_t mark = 0;
    accord_failure failure{};
    int32_t code;
    {
      WithoutGil released;  // a full queue makes the call wait
      code = queue(after, &mark, &failure);
    }
    if (code != ACCORD_DONE) {
      failures_.fetch_add(1, std::memory_order_relaxed);
      raise_failure(failure);
    }
    for (const at::Tensor& t : touched) {
      t.record_stream(gpu->side);
    }
    gpu_ops_.fetch_add(1, std::memory_order_relaxed);
    return c10::make_intrusive<MarkedWork>(std::move(gpu), mark, std::move(result), getRank(),
                                           type);
  }

  // Runs a host op on registered memory here and now (`run(&failure)`), unless an op of the
  // Python backend is queued or running: this one then goes behind it, through Python. (One
  // that starts after this check finds the communicator taken and waits its turn.)
  template <typename Run>
  c10::intrusive_ptr<c10d::Work> run_on_host(std::vector<at::Tensor> result, c10d::OpType type,
                                             Run run) {
    if (word(kJobs) != 0) {
      return {};
    }
    accord_failure failure{};
    int32_t code;
    {
      WithoutGil released;
      code = run(&failure);
    }
    if (code == ACCORD_DECLINED) {
      return {};
    }
    if (code != ACCORD_DONE) {
      failures_.fetch_add(1, std::memory_order_relaxed);
      raise_failure(failure);
    }
    host_ops_.fetch_add(1, std::memory_order_relaxed);
    return c10::make_intrusive<DoneWork>(std::move(result), getRank(), type);
  }

  // Hands the op to the Python backend's `method` (the whole op: checks, registration, queues,
  // staging and errors).
  template <typename... Args>
  c10::intrusive_ptr<c10d::Work> in_python(const char* method, const char* op, c10d::OpType type,
                                           Args&... args) {
    py::gil_scoped_acquire gil;
    py::object group = group_ref_();
    if (group.is_none()) {
      throw std::runtime_error(std::string("accord backend: ") + op +
                               " on a process group that is gone");
    }
    py::object work = group.attr(method)(args...);
    return c10::make_intrusive<PythonWork>(std::move(work), type);
  }

  static constexpr int kJobs = 0;
  static constexpr int kP2pPending = 1;

  // A word the Python backend writes under the GIL; read here without it.
  int64_t word(int index) const { return __atomic_load_n(&words_[index], __ATOMIC_ACQUIRE); }

  py::object group_ref_;  // a weakref.ref to the Python process group (it holds this backend)
  const accord_torch_api* api_;
  py::object host_keep_;  // the group's accord.Communicator
  uintptr_t host_comm_ = 0;
  std::mutex gpu_mutex_;
  std::shared_ptr<const GpuPath> gpu_;
  py::object words_keep_;
  std::unique_ptr<py::buffer_info> words_view_;
  int64_t* words_ = nullptr;
  std::atomic<uint64_t> gpu_ops_{0};
  std::atomic<uint64_t> host_ops_{0};
  std::atomic<uint64_t> failures_{0};
};

}  // namespace

PYBIND11_MODULE(accord_torch_native, m) {
  m.doc() = "accord.torch's compiled backend (built by accord._torch_native)";
  m.attr("ABI") = ACCORD_TORCH_ABI;
  py::module_::import("torch.distributed");
  // The handles, registered so that Python sees their own exception() (torch's binding of the
  // C++ method cannot convert what it returns); everything else is torch's Work.
  py::class_<MarkedWork, c10d::Work, c10::intrusive_ptr<MarkedWork>>(m, "MarkedWork")
      .def("exception", &MarkedWork::exception_object);
  py::class_<DoneWork, c10d::Work, c10::intrusive_ptr<DoneWork>>(m, "DoneWork")
      .def("exception", &DoneWork::exception_object);
  py::class_<PythonWork, c10d::Work, c10::intrusive_ptr<PythonWork>>(m, "PythonWork")
      .def("exception", &PythonWork::exception_object);
  py::class_<AccordNative, c10d::Backend, c10::intrusive_ptr<AccordNative>>(m, "AccordNative")
      .def(py::init<int, int, py::object, uintptr_t, py::object, py::object>(), py::arg("rank"),
           py::arg("size"), py::arg("group_ref"), py::arg("api"), py::arg("host_comm"),
           py::arg("words"))
      .def("set_gpu", &AccordNative::set_gpu, py::arg("comm"), py::arg("stream_id"),
           py::arg("device_index"), py::arg("device_type"), py::arg("side_raw"),
           py::arg("bytes_max"))
      .def("native_ops", &AccordNative::native_ops)
      .def("native_failures", &AccordNative::native_failures);
}
