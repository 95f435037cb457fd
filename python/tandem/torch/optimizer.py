"""DistributedOptimizer with horovod.torch's semantics.

Gradients are reduced while backward still runs: a hook on each parameter's
gradient accumulator marks it ready; parameters are grouped, in reverse
registration order (the order backward produces them), into buckets of at
most TANDEM_FUSION_THRESHOLD bytes (Horovod's HOROVOD_FUSION_THRESHOLD,
default 64 MiB; the first bucket is capped at 1 MiB so communication starts
early); a bucket whose gradients are all ready is handed to Tandem's
non-blocking allreduce, which the communicator's
progress thread runs while backward goes on. Buckets are issued strictly in
bucket order, so every rank issues the same collectives in the same order
even if hooks fire in a different order (Tandem, like NCCL, matches
collectives by issue order). step() waits for the buckets and runs the
wrapped optimizer.

Without compression each bucket is one flat buffer and every .grad is a
view into it (DDP's gradient_as_bucket_view): autograd accumulates in
place, the bucket is reduced in place, nothing is packed or copied back.
With fp16/bf16 compression the gradients are packed into the (smaller)
wire buffer and the results copied back into .grad."""
import os
from contextlib import contextmanager

import torch

import tandem
from . import ops
from .compression import Compression
from . import join_protocol as _join


def _env_bytes(name, default):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"tandem.torch: {name}={v!r} is not a byte count") from None
    if n < 0:
        raise ValueError(f"tandem.torch: {name}={v!r} must be >= 0")
    return n


class _Bucket:
    __slots__ = ("params", "numel", "dtype", "device", "pending", "flat", "views", "request", "ctx", "wire", "desc")

    def __init__(self, dtype, device):
        self.params, self.numel, self.dtype, self.device = [], 0, dtype, device
        self.pending = 0
        self.flat = self.views = self.request = self.ctx = self.wire = self.desc = None


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor):
        super(self.__class__, self).__init__(params)
        self._compression = ops.check_compression(compression)
        if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
                or backward_passes_per_step < 1:
            raise ValueError(f"tandem.torch: backward_passes_per_step must be an int >= 1, "
                             f"got {backward_passes_per_step!r}")
        self.backward_passes_per_step = backward_passes_per_step
        op = ops._op(op)
        if isinstance(gradient_predivide_factor, bool) or not isinstance(gradient_predivide_factor, (int, float)):
            raise TypeError(f"tandem.torch: gradient_predivide_factor must be a number, "
                            f"not {type(gradient_predivide_factor).__name__}")
        predivide = float(gradient_predivide_factor)
        if predivide <= 0:
            raise ValueError(f"tandem.torch: gradient_predivide_factor must be > 0, got {predivide}")
        if predivide != 1.0 and op != ops.Average:
            raise ValueError("tandem.torch: gradient_predivide_factor needs op=Average")
        n = tandem.size()
        # Average with a predivide factor f: each rank scales by 1/f, the sum
        # is scaled by f/size (Horovod's split of the division).
        if op == ops.Average and predivide != 1.0:
            self._op, self._prescale, self._postscale = ops.Sum, 1.0 / predivide, predivide / n
        else:
            self._op, self._prescale, self._postscale = op, 1.0, 1.0

        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(x, tuple) or len(x) != 2 for x in named):
                raise ValueError("tandem.torch: named_parameters must be (name, parameter) pairs, "
                                 "e.g. model.named_parameters()")
            names = [k for k, _ in named]
            dup = {k for k in names if names.count(k) > 1}
            if dup:
                raise ValueError(f"tandem.torch: named_parameters has duplicate names {sorted(dup)}")
            by_id = {id(v): k for k, v in named}
            missing = [i for i, p in enumerate(all_params) if id(p) not in by_id]
            if missing:
                raise ValueError(f"tandem.torch: named_parameters lacks {len(missing)} parameter(s) of the "
                                 "optimizer; pass model.named_parameters() of the model being optimized")
            self._names = {p: by_id[id(p)] for p in all_params}
        else:
            self._names = {p: f"param.{i}" for i, p in enumerate(all_params)}

        self._params = [p for p in all_params if p.requires_grad]
        threshold = _env_bytes("TANDEM_FUSION_THRESHOLD", 64 << 20)
        first_cap = min(threshold, _env_bytes("TANDEM_FUSION_FIRST_BUCKET", 1 << 20))
        self._buckets = []
        self._bucket_of = {}
        cur = None
        for p in reversed(self._params):
            cap = first_cap if len(self._buckets) <= 1 else threshold
            nbytes = p.numel() * p.element_size()
            if cur is None or cur.dtype != p.dtype or cur.device != p.device or \
                    (cur.params and (cur.numel * p.element_size() + nbytes) > cap):
                cur = _Bucket(p.dtype, p.device)
                self._buckets.append(cur)
            cur.params.append(p)
            cur.numel += p.numel()
            self._bucket_of[p] = cur
        for b in self._buckets:
            ops._code(torch.empty(0, dtype=b.dtype, device=b.device), f"parameter of dtype {b.dtype} on {b.device}")
        self._passes = {p: 0 for p in self._params}
        self._next_bucket = 0
        self._synchronized = False
        self._should_synchronize = True
        self._hooks = []
        self._grad_accs = []
        if tandem.size() > 1:
            if self._compression is Compression.none:
                self._make_flat()
            self._register_hooks()

    def _make_flat(self):
        """One flat buffer per bucket; each parameter's .grad becomes a view
        of it (existing gradients are copied in)."""
        for b in self._buckets:
            b.flat = torch.zeros(b.numel, dtype=b.dtype, device=b.device)
            b.views, off = [], 0
            for p in b.params:
                k = p.numel()
                view = b.flat[off:off + k].view_as(p)
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
                b.views.append(view)
                off += k

    # ---- hooks ----

    def _register_hooks(self):
        for p in self._params:
            # The AccumulateGrad node of p: its hook runs after p.grad is final
            # for this backward pass.
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hooks.append(acc.register_hook(self._make_hook(p)))
            self._grad_accs.append(acc)

    def _make_hook(self, p):
        def hook(*_):
            self._passes[p] += 1
            if self._passes[p] > self.backward_passes_per_step:
                raise AssertionError(
                    f"tandem.torch: the gradient of {self._names[p]} was computed more than "
                    f"backward_passes_per_step={self.backward_passes_per_step} times before step(); "
                    "raise backward_passes_per_step to accumulate gradients locally")
            if self._passes[p] == self.backward_passes_per_step:
                b = self._bucket_of[p]
                b.pending -= 1
                if b.pending == 0:
                    self._launch_ready()
        return hook

    def _arm(self):
        """Before the first hook of a step: every bucket waits for all its params."""
        for b in self._buckets:
            if b.request is None:
                b.pending = len(b.params)

    def _launch(self, b):
        if b.flat is not None:
            self._launch_flat(b)
            return
        grads = []
        for p in b.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)  # unused in this step: contributes zeros (as Horovod)
            grads.append(p.grad.reshape(-1))
        flat = torch.cat(grads) if len(grads) > 1 else grads[0].clone()
        wire, ctx = self._compression.compress(flat)
        if self._prescale != 1.0:
            wire.mul_(self._prescale)
        wire = wire.contiguous()
        b.wire, b.ctx = wire, ctx
        b.desc = _join.announce_async(tandem.world(), _join.K_ALLREDUCE, wire.numel(), ops._code(wire), self._op)
        ops._ready(wire)
        b.request = tandem.world().iallreduce(wire.data_ptr(), wire.data_ptr(), wire.numel(), ops._code(wire),
                                              self._op, keep=wire)

    def _launch_flat(self, b):
        """Zero-copy bucket (DDP's gradient_as_bucket_view): each .grad is a
        view into b.flat, autograd accumulates into it in place, and the
        bucket is reduced in place: no packing, no copy back. A .grad that
        is not the view (None after zero_grad(set_to_none=True), or replaced
        by the script) is copied in once and the view put back."""
        for p, view in zip(b.params, b.views):
            g = p.grad
            if g is None:
                view.zero_()
                p.grad = view
            elif g.data_ptr() != view.data_ptr() or g.stride() != view.stride():
                view.copy_(g)
                p.grad = view
        if self._prescale != 1.0:
            b.flat.mul_(self._prescale)
        b.wire = b.flat
        # for ranks in hvd.join(): they contribute zeros to this bucket
        b.desc = _join.announce_async(tandem.world(), _join.K_ALLREDUCE, b.flat.numel(), ops._code(b.flat),
                                      self._op)
        ops._ready(b.flat)
        b.request = tandem.world().iallreduce(b.flat.data_ptr(), b.flat.data_ptr(), b.flat.numel(),
                                              ops._code(b.flat), self._op, keep=b.flat)

    def _launch_ready(self):
        while self._next_bucket < len(self._buckets) and self._buckets[self._next_bucket].pending == 0:
            self._launch(self._buckets[self._next_bucket])
            self._next_bucket += 1

    # ---- Horovod's interface ----

    def synchronize(self):
        """Finish reducing every gradient (launching the buckets whose
        parameters got no gradient this step); .grad then holds the result."""
        if tandem.size() > 1:
            for b in self._buckets[self._next_bucket:]:
                b.pending = 0
            self._launch_ready()
            try:
                for b in self._buckets:
                    if b.request is None:
                        continue
                    if b.desc is not None:
                        b.desc.wait()
                    b.request.wait()
                    if b.flat is not None:  # .grad are views of the reduced bucket already
                        if self._postscale != 1.0:
                            b.flat.mul_(self._postscale)
                        continue
                    res = self._compression.decompress(b.wire, b.ctx)
                    if self._postscale != 1.0:
                        res = res.mul_(self._postscale)
                    off = 0
                    for p in b.params:
                        k = p.numel()
                        p.grad.copy_(res[off:off + k].view_as(p.grad))
                        off += k
            finally:
                for b in self._buckets:
                    b.request = b.wire = b.ctx = b.desc = None
                self._reset()
        self._synchronized = True

    def _reset(self):
        for p in self._passes:
            self._passes[p] = 0
        self._next_bucket = 0
        self._arm()

    @contextmanager
    def skip_synchronize(self):
        """Within this block step() does not synchronize (call synchronize() yourself first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                import warnings
                warnings.warn("optimizer.step() called without a new backward after synchronize(): "
                              "the gradients are reduced once; use skip_synchronize() to say so")
            else:
                self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if any(b.request is not None for b in self._buckets) or any(self._passes.values()):
            raise AssertionError("tandem.torch: optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(); call one of them first")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=ops.Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=None):
    """Wrap `optimizer` so that step() applies gradients averaged (op) over all
    ranks, reduced during backward (horovod.torch.DistributedOptimizer)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"tandem.torch: DistributedOptimizer wraps a torch.optim.Optimizer, "
                        f"not {type(optimizer).__name__}")
    ops._no_process_set(process_set)
    # num_groups/groups only steer Horovod's fusion; Tandem's buckets come from
    # TANDEM_FUSION_THRESHOLD. sparse_as_dense: gradients are dense here anyway.
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    d = cls.__new__(cls)
    _DistributedOptimizer.__init__(d, optimizer.param_groups, named_parameters, compression,
                                   backward_passes_per_step, op, gradient_predivide_factor)
    d._arm()
    return d
