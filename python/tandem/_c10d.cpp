// tandem._c10d: the "tandem" backend of torch.distributed (c10d ProcessGroup),
// built against Debian's libtorch-dev 1.13.
//
// Each collective is issued at once as a Tandem non-blocking operation on the
// caller's tensors (contiguous CPU or CUDA tensors by pointer; others through
// a contiguous staging copy on the same device, copied back at completion).
// CUDA tensors: Tandem reduces device memory itself (NCCL or staged through
// pinned host memory, src/comm/device); before a call reads one, ready()
// synchronizes torch's current stream of its device, so whatever torch
// queued that writes it (backward, a staging copy) has finished. One completion thread
// per process group waits for the requests in issue order, runs the
// copy-backs and completes each Work's Future, which is what DDP's reducer
// waits on, so buckets are reduced while backward continues.
//
// The td_comm comes from a tandem._tandem.Comm object and is driven through
// the function table that _tandem exports as a capsule: one copy of the
// library per process. Calls that Tandem cannot serve raise c10d's own
// "ProcessGroup tandem does not support <call>" (the base class) or a
// message naming the call and the unsupported option.
#include <Python.h>
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <condition_variable>
#include <deque>
#include <algorithm>
#include <functional>
#include <mutex>
#include <thread>

extern "C" {
#include "_tandem_api.h"
}

namespace {

const tandem_py_api *api = nullptr;

td_dtype dtype_of(const at::Tensor &t, const char *call) {
  switch (t.scalar_type()) {
  case at::kFloat: return TD_F32;
  case at::kDouble: return TD_F64;
  case at::kHalf: return TD_F16;
  case at::kBFloat16: return TD_BF16;
  case at::kInt: return TD_I32;
  case at::kLong: return TD_I64;
  case at::kByte: return TD_U8;
  case at::kBool: return TD_U8; // max/min on 0/1 bytes are or/and
  default:
    TORCH_CHECK(false, "ProcessGroup tandem: ", call, ": unsupported dtype ", t.scalar_type(),
                " (supported: float32, float64, float16, bfloat16, int32, int64, uint8, bool)");
  }
}

td_op op_of(const c10d::ReduceOp &op, const char *call) {
  switch (op.op_) {
  case c10d::ReduceOp::SUM: return TD_SUM;
  case c10d::ReduceOp::AVG: return TD_AVG;
  case c10d::ReduceOp::MIN: return TD_MIN;
  case c10d::ReduceOp::MAX: return TD_MAX;
  case c10d::ReduceOp::PRODUCT: return TD_PROD;
  default:
    TORCH_CHECK(false, "ProcessGroup tandem: ", call,
                ": unsupported ReduceOp (supported: SUM, AVG, MIN, MAX, PRODUCT)");
  }
}

void check_placement(const at::Tensor &t, const char *call) {
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "ProcessGroup tandem: ", call, ": tensor is on ",
              t.device(), "; Tandem serves CPU and CUDA tensors");
  TORCH_CHECK(!t.is_sparse(), "ProcessGroup tandem: ", call, ": sparse tensors are not supported");
}

// Torch's work queued on t's device has finished (CUDA: its current stream
// synchronized, through c10's device interface, so this file needs no CUDA
// header and builds against a CPU-only libtorch). CPU tensors: nothing.
void ready(const at::Tensor &t) {
  if (!t.device().is_cuda()) return;
  c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device()).synchronize();
}

class WorkTandem;

// Requests complete in issue order (one communicator runs them in order), so
// one thread waiting on them in that order completes every Work promptly.
//
// The GIL rule (what hung py_np2): the completer thread must never drop the
// last reference to a tensor, a Future or a lambda that may own a Python
// object. A tensor whose Python object died while C++ still held it (any
// tensor passed from Python with async_op=True, then dropped) owns that
// object, and its destructor takes the GIL. So finished items go to done_,
// and are released by a thread that may take the GIL: the next issuing call
// (push) or the process group's destructor, which in turn never holds the
// GIL while it joins this thread.
class Completer {
 public:
  struct Item {
    std::vector<td_request *> reqs;
    std::function<void()> finish; // copy-backs, on success
    c10::intrusive_ptr<c10::ivalue::Future> future;
    std::vector<at::Tensor> outputs;
    std::vector<at::Tensor> keep; // staging buffers the requests use
  };

  explicit Completer(td_comm *comm) : comm_(comm), thread_([this] { run(); }) {}
  ~Completer() { stop(); } // the owner calls stop() first, without the GIL
  // Finish every queued item and end the thread. Waits end: every Tandem
  // operation has a deadline (the group's timeout), so a peer that never
  // issues its side turns into an error here, not a hang.
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(Item item) {
    release_done();
    {
      std::lock_guard<std::mutex> g(mu_);
      q_.push_back(std::move(item));
    }
    cv_.notify_one();
  }
  // Drop the finished items here, on a thread that may take the GIL.
  void release_done() {
    std::vector<Item> done;
    {
      std::lock_guard<std::mutex> g(mu_);
      done.swap(done_);
    }
  }

 private:
  void run() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return stop_ || !q_.empty(); });
        if (q_.empty()) return; // stop_ and drained
        item = std::move(q_.front());
        q_.pop_front();
      }
      complete(item);
      std::lock_guard<std::mutex> g(mu_);
      done_.push_back(std::move(item));
    }
  }

  void complete(Item &item) {
    td_status first = TD_OK;
    std::string msg;
    for (td_request *r : item.reqs) {
      td_status st = api->wait(r);
      if (st != TD_OK && first == TD_OK) {
        first = st;
        const char *m = api->last_error();
        if (!m || !*m) m = api->comm_last_error(comm_);
        msg = m ? m : api->status_str(st);
      }
    }
    if (first != TD_OK) {
      item.future->setError(std::make_exception_ptr(
          std::runtime_error(std::string("ProcessGroup tandem: ") + api->status_str(first) + ": " + msg)));
      return;
    }
    try {
      if (item.finish) item.finish();
      item.future->markCompleted(c10::IValue(item.outputs));
    } catch (...) {
      item.future->setError(std::current_exception());
    }
  }

  td_comm *comm_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> q_;
  std::vector<Item> done_;
  bool stop_ = false;
  std::thread thread_;
};

class WorkTandem : public c10d::Work {
 public:
  WorkTandem(int rank, c10d::OpType type, c10::intrusive_ptr<c10::ivalue::Future> fut,
             std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type), future_(std::move(fut)), outputs_(std::move(outputs)) {}
  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override { return future_->hasError() ? future_->exception_ptr() : nullptr; }
  std::vector<at::Tensor> result() override { return outputs_; }
  bool wait(std::chrono::milliseconds timeout) override {
    // Tandem ops carry their own deadline (TANDEM_TIMEOUT / the group's
    // timeout), so the wait always ends.
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<at::Tensor> outputs_;
};

class ProcessGroupTandem : public c10d::ProcessGroup {
 public:
  ProcessGroupTandem(py::object py_comm, int rank, int size)
      : c10d::ProcessGroup(rank, size), py_comm_(std::move(py_comm)) {
    comm_ = api->comm_of(py_comm_.ptr());
    if (!comm_) throw py::error_already_set();
    completer_ = std::make_unique<Completer>(comm_);
  }
  ~ProcessGroupTandem() override {
    // Wait for every pending request without holding the GIL: the
    // completer may need it (a Python callback chained on a Work's future).
    // This destructor runs wherever the last reference goes: in
    // destroy_process_group, in a garbage collection, at exit.
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release nogil;
      completer_->stop();
    } else {
      completer_->stop();
    }
    if (!Py_IsInitialized()) { // after interpreter shutdown: Python objects are gone already
      (void)py_comm_.release();
      (void)completer_.release(); // its items may hold Python-owned tensors; the process is ending
      return;
    }
    py::gil_scoped_acquire g;
    completer_.reset(); // finished items, with the GIL (see Completer)
    py_comm_ = py::object();
  }

  const std::string getBackendName() const override { return "tandem"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                           const c10d::BroadcastOptions &opts) override {
    int root = (int)opts.rootRank;
    return in_place(c10d::OpType::BROADCAST, tensors, "broadcast", [&](void *p, size_t n, td_dtype dt, td_request **r) {
      return api->ibroadcast(p, n, dt, root, comm_, r);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                           const c10d::AllreduceOptions &opts) override {
    td_op op = op_of(opts.reduceOp, "allreduce");
    return in_place(c10d::OpType::ALLREDUCE, tensors, "allreduce", [&](void *p, size_t n, td_dtype dt, td_request **r) {
      return api->iallreduce(p, p, n, dt, op, comm_, r);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                                     const c10d::AllreduceCoalescedOptions &opts) override {
    const char *call = "allreduce_coalesced";
    std::vector<td_request *> reqs;
    std::vector<std::function<void()>> backs;
    std::vector<at::Tensor> keep;
    for (auto &t : tensors) {
      Staged s = stage(t, call);
      ready(s.buf);
      td_request *r = nullptr;
      void *p = s.buf.data_ptr();
      check(api->iallreduce(p, p, s.buf.numel(), dtype_of(t, call), op_of(opts.reduceOp, call), comm_, &r), call);
      reqs.push_back(r);
      backs.push_back(s.copy_back(t));
      keep.push_back(s.buf);
    }
    return submit(c10d::OpType::ALLREDUCE_COALESCED, reqs, tensors, join(backs), keep);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                        const c10d::ReduceOptions &opts) override {
    td_op op = op_of(opts.reduceOp, "reduce");
    int root = (int)opts.rootRank;
    return in_place(c10d::OpType::REDUCE, tensors, "reduce", [&](void *p, size_t n, td_dtype dt, td_request **r) {
      return api->ireduce(p, p, n, dt, op, root, comm_, r);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                           std::vector<at::Tensor> &inputs,
                                           const c10d::AllgatherOptions &opts) override {
    const char *call = "allgather";
    one_tensor(inputs, call);
    TORCH_CHECK(outputs.size() == 1 && (int)outputs[0].size() == getSize(), "ProcessGroup tandem: ", call,
                ": needs one list of ", getSize(), " output tensors");
    at::Tensor in = inputs[0].contiguous();
    for (auto &o : outputs[0])
      TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(), "ProcessGroup tandem: ", call,
                  ": every output must have the input's size and dtype");
    // Every rank's block in one flat buffer (equal blocks: shard r is block r).
    at::Tensor flat = at::empty({(int64_t)getSize() * in.numel()}, in.options());
    td_request *r = nullptr;
    ready(in);
    check(api->iallgather(in.data_ptr(), flat.data_ptr(), flat.numel(), dtype_of(in, call), comm_, &r), call);
    std::vector<at::Tensor> outs = outputs[0];
    int64_t n = in.numel();
    auto back = [outs, flat, n]() mutable {
      for (size_t i = 0; i < outs.size(); i++) outs[i].copy_(flat.narrow(0, (int64_t)i * n, n).view(outs[i].sizes()));
    };
    return submit(c10d::OpType::ALLGATHER, {r}, outs, back, {in, flat});
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                 const c10d::AllgatherOptions &opts) override {
    const char *call = "_allgather_base";
    check_placement(input, call);
    TORCH_CHECK(output.numel() == input.numel() * getSize(), "ProcessGroup tandem: ", call,
                ": output must hold size * input elements");
    at::Tensor in = input.contiguous();
    Staged s = stage(output, call);
    td_request *r = nullptr;
    ready(in);
    check(api->iallgather(in.data_ptr(), s.buf.data_ptr(), s.buf.numel(), dtype_of(in, call), comm_, &r), call);
    std::vector<at::Tensor> outs{output};
    return submit(c10d::OpType::_ALLGATHER_BASE, {r}, outs, s.copy_back(output), {in, s.buf});
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                std::vector<std::vector<at::Tensor>> &inputs,
                                                const c10d::ReduceScatterOptions &opts) override {
    const char *call = "reduce_scatter";
    one_tensor(outputs, call);
    TORCH_CHECK(inputs.size() == 1 && (int)inputs[0].size() == getSize(), "ProcessGroup tandem: ", call,
                ": needs one list of ", getSize(), " input tensors");
    at::Tensor &out = outputs[0];
    std::vector<at::Tensor> flat_in;
    for (auto &t : inputs[0]) {
      TORCH_CHECK(t.numel() == out.numel(), "ProcessGroup tandem: ", call,
                  ": every input must have the output's size");
      flat_in.push_back(t.reshape({-1}));
    }
    at::Tensor flat = at::cat(flat_in);
    Staged s = stage(out, call);
    td_request *r = nullptr;
    ready(flat);
    check(api->ireduce_scatter(flat.data_ptr(), s.buf.data_ptr(), flat.numel(), dtype_of(out, call),
                               op_of(opts.reduceOp, call), comm_, &r),
          call);
    return submit(c10d::OpType::REDUCE_SCATTER, {r}, outputs, s.copy_back(out), {flat, s.buf});
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                                      const c10d::ReduceScatterOptions &opts) override {
    const char *call = "_reduce_scatter_base";
    check_placement(input, call);
    TORCH_CHECK(input.numel() == output.numel() * getSize(), "ProcessGroup tandem: ", call,
                ": input must hold size * output elements");
    at::Tensor in = input.contiguous();
    Staged s = stage(output, call);
    td_request *r = nullptr;
    ready(in);
    check(api->ireduce_scatter(in.data_ptr(), s.buf.data_ptr(), in.numel(), dtype_of(in, call),
                               op_of(opts.reduceOp, call), comm_, &r),
          call);
    std::vector<at::Tensor> outs{output};
    return submit(c10d::OpType::_REDUCE_SCATTER_BASE, {r}, outs, s.copy_back(output), {in, s.buf});
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                               std::vector<int64_t> &outputSplitSizes,
                                               std::vector<int64_t> &inputSplitSizes,
                                               const c10d::AllToAllOptions &opts) override {
    const char *call = "alltoall_base";
    check_placement(input, call);
    check_placement(output, call);
    TORCH_CHECK(input.scalar_type() == output.scalar_type(), "ProcessGroup tandem: ", call,
                ": input and output must have the same dtype");
    int n = getSize();
    if (outputSplitSizes.empty() && inputSplitSizes.empty()) {
      TORCH_CHECK(input.numel() == output.numel() && input.numel() % n == 0, "ProcessGroup tandem: ", call,
                  ": input and output must have the same size, divisible by the world size");
      at::Tensor in = input.contiguous();
      Staged s = stage(output, call);
      td_request *r = nullptr;
      ready(in);
      check(api->ialltoall(in.data_ptr(), s.buf.data_ptr(), in.numel() / n, dtype_of(in, call), comm_, &r), call);
      std::vector<at::Tensor> outs{output};
      return submit(c10d::OpType::ALLTOALL_BASE, {r}, outs, s.copy_back(output), {in, s.buf});
    }
    return alltoall_uneven(output, input, outputSplitSizes, inputSplitSizes, call);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dstRank, int tag) override {
    const char *call = "send";
    one_tensor(tensors, call);
    TORCH_CHECK(tag == 0, "ProcessGroup tandem: send: tags are not supported (messages match in issue order)");
    at::Tensor in = tensors[0].contiguous();
    td_request *r = nullptr;
    check(api->isend(in.data_ptr(), in.numel(), dtype_of(in, call), dstRank, comm_, &r), call);
    return submit(c10d::OpType::SEND, {r}, tensors, nullptr, {in});
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int srcRank, int tag) override {
    TORCH_CHECK(tag == 0, "ProcessGroup tandem: recv: tags are not supported (messages match in issue order)");
    return in_place(c10d::OpType::RECV, tensors, "recv", [&](void *p, size_t n, td_dtype dt, td_request **r) {
      return api->irecv(p, n, dt, srcRank, comm_, r);
    });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override {
    td_request *r = nullptr;
    check(api->ibarrier(comm_, &r), "barrier");
    return submit(c10d::OpType::BARRIER, {r}, {}, nullptr, {});
  }

 private:
  // The one-tensor operations that work in place on tensors[0] (through a
  // contiguous staging copy when it is not contiguous): `issue(ptr, count,
  // dtype, &req)` starts the Tandem operation.
  template <class Issue>
  c10::intrusive_ptr<c10d::Work> in_place(c10d::OpType type, std::vector<at::Tensor> &tensors, const char *call,
                                          Issue issue) {
    one_tensor(tensors, call);
    at::Tensor &t = tensors[0];
    Staged s = stage(t, call);
    ready(s.buf);
    td_request *r = nullptr;
    check(issue(s.buf.data_ptr(), (size_t)s.buf.numel(), dtype_of(t, call), &r), call);
    return submit(type, {r}, tensors, s.copy_back(t), {s.buf});
  }

  // Uneven splits (rows along dimension 0; an empty list means equal ones):
  // every block is padded to the largest block of any rank, found with one
  // small blocking MAX allreduce, and the padded buffers go through Tandem's
  // alltoall; the finish step unpacks the received rows into `output`.
  c10::intrusive_ptr<c10d::Work> alltoall_uneven(at::Tensor &output, at::Tensor &input,
                                                 std::vector<int64_t> out_splits, std::vector<int64_t> in_splits,
                                                 const char *call) {
    int n = getSize();
    TORCH_CHECK(input.dim() >= 1 && output.dim() >= 1, "ProcessGroup tandem: ", call,
                ": uneven splits need tensors with at least one dimension");
    int64_t out_row = output.size(0) ? output.numel() / output.size(0) : 1;
    int64_t row = input.size(0) ? input.numel() / input.size(0) : out_row;
    if (!output.size(0)) out_row = row;
    TORCH_CHECK(input.numel() == row * input.size(0) && out_row == row, "ProcessGroup tandem: ", call,
                ": input and output rows must have the same number of elements");
    auto fill = [n](std::vector<int64_t> &sp, int64_t rows, const char *which, const char *c) {
      if (sp.empty()) {
        TORCH_CHECK(rows % n == 0, "ProcessGroup tandem: ", c, ": ", which, " has ", rows,
                    " rows, not divisible by the world size ", n, "; give its split sizes");
        sp.assign(n, rows / n);
      }
      TORCH_CHECK((int)sp.size() == n, "ProcessGroup tandem: ", c, ": ", which, " split sizes have ", sp.size(),
                  " entries for ", n, " ranks");
      int64_t sum = 0;
      for (int64_t v : sp) {
        TORCH_CHECK(v >= 0, "ProcessGroup tandem: ", c, ": ", which, " split sizes must be >= 0");
        sum += v;
      }
      TORCH_CHECK(sum == rows, "ProcessGroup tandem: ", c, ": ", which, " split sizes sum to ", sum, " but it has ",
                  rows, " rows");
    };
    fill(in_splits, input.size(0), "input", call);
    fill(out_splits, output.size(0), "output", call);
    int64_t big = 0;
    for (int i = 0; i < n; i++) big = std::max({big, in_splits[i], out_splits[i]});
    at::Tensor mx = at::full({1}, big, at::kLong);
    td_request *r = nullptr;
    check(api->iallreduce(mx.data_ptr(), mx.data_ptr(), 1, TD_I64, TD_MAX, comm_, &r), call);
    td_status st = api->wait(r);
    check(st, call);
    big = mx.item<int64_t>();
    td_dtype dt = dtype_of(input, call);
    at::Tensor in = input.contiguous().view({input.size(0), row});
    at::Tensor send = at::zeros({(int64_t)n * big, row}, input.options());
    for (int64_t j = 0, off = 0; j < n; off += in_splits[j], j++)
      if (in_splits[j]) send.narrow(0, j * big, in_splits[j]).copy_(in.narrow(0, off, in_splits[j]));
    at::Tensor recv = at::empty({(int64_t)n * big, row}, input.options());
    r = nullptr;
    ready(send);
    check(api->ialltoall(send.data_ptr(), recv.data_ptr(), (size_t)(big * row), dt, comm_, &r), call);
    std::vector<at::Tensor> outs{output};
    auto back = [output, recv, out_splits, big, row, n]() mutable {
      bool direct = output.is_contiguous();
      at::Tensor o = direct ? output.view({output.size(0), row}) : at::empty({output.size(0), row}, output.options());
      for (int64_t j = 0, off = 0; j < n; off += out_splits[j], j++)
        if (out_splits[j]) o.narrow(0, off, out_splits[j]).copy_(recv.narrow(0, j * big, out_splits[j]));
      if (!direct) output.copy_(o.view(output.sizes()));
    };
    return submit(c10d::OpType::ALLTOALL_BASE, {r}, outs, back, {send, recv});
  }

  struct Staged {
    at::Tensor buf;
    bool copied;
    std::function<void()> copy_back(at::Tensor t) {
      if (!copied) return nullptr;
      at::Tensor b = buf;
      return [t, b]() mutable { t.copy_(b.view(t.sizes())); };
    }
  };

  // The tensor itself when contiguous; otherwise a contiguous copy whose
  // result is copied back at completion.
  Staged stage(at::Tensor &t, const char *call) {
    check_placement(t, call);
    dtype_of(t, call);
    if (t.is_contiguous()) return Staged{t, false};
    return Staged{t.contiguous(), true};
  }

  void one_tensor(std::vector<at::Tensor> &tensors, const char *call) {
    TORCH_CHECK(tensors.size() == 1, "ProcessGroup tandem: ", call, ": takes exactly one tensor per rank, got ",
                tensors.size());
    check_placement(tensors[0], call);
  }

  void check(td_status st, const char *call) {
    if (st == TD_OK) return;
    const char *m = api->last_error();
    if (!m || !*m) m = api->comm_last_error(comm_);
    TORCH_CHECK(false, "ProcessGroup tandem: ", call, ": ", api->status_str(st), ": ", m ? m : "");
  }

  static std::function<void()> join(std::vector<std::function<void()>> fs) {
    return [fs]() {
      for (auto &f : fs)
        if (f) f();
    };
  }

  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, std::vector<td_request *> reqs,
                                        std::vector<at::Tensor> outputs, std::function<void()> finish,
                                        std::vector<at::Tensor> keep) {
    // A Future holding CUDA tensors must name their devices (markCompleted
    // refuses tensors on devices it was not told of; DDP waits on it).
    std::vector<c10::Device> devices;
    for (auto &t : outputs)
      if (t.device().is_cuda() && std::find(devices.begin(), devices.end(), t.device()) == devices.end())
        devices.push_back(t.device());
    auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
    auto work = c10::make_intrusive<WorkTandem>(getRank(), type, fut, outputs);
    completer_->push(Completer::Item{std::move(reqs), std::move(finish), fut, std::move(outputs), std::move(keep)});
    return work;
  }

  py::object py_comm_;
  td_comm *comm_ = nullptr;
  std::unique_ptr<Completer> completer_;
};

} // namespace

PYBIND11_MODULE(_c10d, m) {
  api = static_cast<const tandem_py_api *>(PyCapsule_Import("tandem._tandem._C_API", 0));
  if (!api) throw py::error_already_set();
  if (api->version != TANDEM_PY_API_VERSION) throw std::runtime_error("tandem._c10d: tandem._tandem API mismatch");
  py::module_::import("torch.distributed"); // registers c10d::ProcessGroup with pybind11
  py::class_<ProcessGroupTandem, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupTandem>>(m, "ProcessGroupTandem")
      .def(py::init([](py::object comm, int rank, int size) {
             return c10::make_intrusive<ProcessGroupTandem>(std::move(comm), rank, size);
           }),
           py::arg("comm"), py::arg("rank"), py::arg("size"));
}
