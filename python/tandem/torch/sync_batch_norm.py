"""hvd.SyncBatchNorm: batch normalization over the whole job's batch.

Each rank holds a slice of the global batch (its own size; the slices may
differ). In training the statistics are those of the concatenated batch:

  forward   one allreduce (sum) of [sum x, sum x^2, count] per channel gives
            the global mean and biased variance; x is normalized with them,
            and the running statistics take the unbiased variance
            (count / (count - 1)), as torch's BatchNorm does.
  backward  with xhat = (x - mean) * invstd and g = dy * weight, the input
            gradient needs two global sums per channel, sum g and
            sum g * xhat (one allreduce):
              dx = invstd * (g - sum g / count - xhat * sum(g * xhat) / count)
            The weight and bias gradients are this rank's own sums (dy * xhat,
            dy); the optimizer's gradient allreduce combines them across
            ranks, as for every other parameter (Horovod and torch do the same).

Every rank must call forward and backward in the same order (they are
collectives). In eval mode with running statistics it is plain batch
normalization with them, no communication."""
import torch
import torch.nn.functional as F

from . import ops


def _reduce_sum(t):
    """Allreduce-sum of a float64 tensor across the job, in place; returns it."""
    return ops.allreduce_(t, op=ops.Sum, name="SyncBatchNorm")


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum):
        c = x.shape[1]
        # (C, everything else): the statistics are per channel over batch and space
        flat = x.transpose(0, 1).reshape(c, -1)
        xd = flat.to(torch.float64)  # the sums in double: counts of millions lose nothing
        stats = torch.cat([xd.sum(1), (xd * xd).sum(1), torch.tensor([float(flat.shape[1])], dtype=torch.float64)])
        _reduce_sum(stats)
        count = stats[2 * c].item()
        if count <= 1:
            raise ValueError(f"tandem.torch.SyncBatchNorm: the whole job's batch holds {count:g} values per channel; "
                             "batch normalization in training needs more than 1")
        mean = stats[:c] / count
        var = (stats[c:2 * c] / count - mean * mean).clamp_min(0)  # biased: what normalizes
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_((var * count / (count - 1)).to(running_var.dtype),
                                                    alpha=momentum)
        invstd = torch.rsqrt(var + eps)
        shape = [1, c] + [1] * (x.dim() - 2)
        xhat = ((x.to(torch.float64) - mean.view(shape)) * invstd.view(shape))
        out = xhat
        if weight is not None:
            out = out * weight.to(torch.float64).view(shape) + bias.to(torch.float64).view(shape)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.count = count
        ctx.has_bias = bias is not None
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xhat, invstd, weight = ctx.saved_tensors
        c = xhat.shape[1]
        shape = [1, c] + [1] * (xhat.dim() - 2)
        dims = [0] + list(range(2, xhat.dim()))
        dyd = dy.to(torch.float64)
        sum_dy = dyd.sum(dims)  # this rank's: the bias gradient
        sum_dy_xhat = (dyd * xhat).sum(dims)  # this rank's: the weight gradient
        w = weight.to(torch.float64) if weight is not None else torch.ones(c, dtype=torch.float64)
        sums = torch.cat([sum_dy * w, sum_dy_xhat * w])  # sum g and sum g * xhat, g = dy * weight
        _reduce_sum(sums)
        g = dyd * w.view(shape)
        dx = invstd.view(shape) * (g - (sums[:c] / ctx.count).view(shape) - xhat * (sums[c:] / ctx.count).view(shape))
        dweight = sum_dy_xhat.to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        dbias = sum_dy.to(weight.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx.to(dy.dtype), dweight, dbias, None, None, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Horovod's hvd.SyncBatchNorm(num_features, eps, momentum, affine,
    track_running_stats): BatchNorm1d/2d/3d whose training statistics are
    the whole job's (inputs of shape (N, C, ...), N may differ per rank)."""

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"tandem.torch.SyncBatchNorm: expected an input of shape (N, C, ...), got {x.dim()}D "
                             f"{tuple(x.shape)}")

    def forward(self, x):
        self._check_input_dim(x)
        if x.shape[1] != self.num_features:
            raise ValueError(f"tandem.torch.SyncBatchNorm: input has {x.shape[1]} channels, the layer "
                             f"{self.num_features}")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average, as torch's BatchNorm
                factor = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or self.running_mean is None
        if not use_batch_stats:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        track = self.training and self.track_running_stats
        return _SyncBatchNormFunction.apply(x, self.weight, self.bias, self.running_mean if track else None,
                                            self.running_var if track else None, self.eps, factor)
