"""AdamW over flat buffers: one fused kernel updates every parameter.

At construction the parameters are packed into flat buffers (2-D weights first, so weight
decay applies to a prefix) and each Parameter is rebound to a view of the working buffer, its
.grad to a view of the gradient buffer. The persistent state is then exactly:

    dtype   working weights   gradients   master   m    v    = bytes per parameter
    fp32    4                 4           -        4    4    = 16 (the weights are the master)
    fp16    2                 2           4        4    4    = 16
    bf16    2                 2           4        4    4    = 16

A step is three launches whatever the model: the gradient's sum of squares (for clipping and
the overflow check), the fused update, and (in zero_grad) one fill of the gradient buffer.

A parameter stored with zero padding rows (Parameter.rows: the tied wte, padded to an aligned
vocabulary) is packed whole, padding included: those elements are real memory in every buffer.
Their gradient is always zero, so m, v and the weights stay exactly zero there (decay keeps 0 at
0). The checkpoint state (master_state, state_dict) holds the parameter rows only.

Data parallel (comm: a tinygrad_like.distributed communicator of R ranks), ZeRO stage `zero`:
    0 (DDP)  the gradient buffer is all-reduced; every rank updates everything
    1        each rank keeps master, m and v of one shard only (1/R of the flat buffers, padded
             to R equal parts): the gradients are reduce-scattered (each rank needs the sum of
             its shard only, so an all-reduce would send half again as much for nothing), the
             rank updates its shard and all-gathers the working weights: the bytes DDP sends
    2        as 1, and the shard of the gradients is all a rank keeps of them between steps:
             the full-size buffer the backward accumulates into lives from zero_grad() to the
             reduce-scatter (one per step, counted in its peak; a bucketed reduce-scatter
             overlapped with the backward would cut it to a bucket)
Bytes per parameter per rank (2-byte dtype): 16; 2 + 2 + 12/R; 2 + (2 + 12)/R.
The gradient norm is the global one (each rank's shard's sum of squares, all-reduced), so
clipping and the fp16 overflow decision are the same on every rank.
"""

import math

import numpy as np

from tinygrad_like import Tensor, autograd, backend, dtypes, kernels, profiler
from tinygrad_like.distributed import Communicator
from tinygrad_like.memory import TRACKER


class AdamW:
    def __init__(
        self,
        named_params,
        lr=6e-4,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=0.1,
        grad_clip=0.0,
        dtype=None,
        comm=None,
        zero=0,
    ):
        named = list(named_params.items() if isinstance(named_params, dict) else named_params)
        if named and not isinstance(named[0], tuple):  # plain parameters: number them
            named = [(str(i), p) for i, p in enumerate(named)]
        if not named:
            raise ValueError("AdamW got no parameters")
        self.lr, self.betas, self.eps = lr, betas, eps
        self.weight_decay, self.grad_clip = weight_decay, grad_clip
        self.step_count = 0
        # decay the 2-D weights (matmuls, embeddings), not biases or layernorm gains
        named.sort(key=lambda kv: kv[1].ndim < 2)
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.n_decay = sum(p.numel() for p in self.params if p.ndim >= 2)
        self.dtype = dtypes.as_dtype(dtype) if dtype is not None else self.params[0].dtype
        if zero not in (0, 1, 2):
            raise ValueError(f"ZeRO stage must be 0, 1 or 2, got {zero}")
        self.comm, self.zero = comm or Communicator(), zero
        self._pack()

    # ---- the flat buffers
    def _pack(self):
        be = self.be = backend.of(self.params[0].data)
        edges = np.cumsum([0] + [p.numel() for p in self.params]).tolist()
        self.spans = {name: (lo, hi) for name, lo, hi in zip(self.names, edges, edges[1:])}
        n, R = edges[-1], self.comm.size
        # the shard this rank updates: all of it (ZeRO-0) or one of R equal parts
        size = -(-n // R) if self.zero else n
        self.numel = size * R if self.zero else n
        self.padding = self.numel - n
        self.shard = (self.comm.rank * size, self.comm.rank * size + size) if self.zero else (0, n)
        lo, hi = self.shard
        master = be.empty((self.numel,), dtypes.float32)
        for p, (a, b) in zip(self.params, self.spans.values()):
            weights = kernels.launch("cast", p.data, dtypes.float32).reshape(-1)
            kernels.launch("copy", master[a:b], weights)
        if self.padding:  # stays 0 in every buffer, like wte's rows
            kernels.launch("fill", master[n:], 0)
        self.comm.broadcast(master, what="weights")  # every rank starts from rank 0's
        if self.dtype == dtypes.float32:
            self.working = None  # the master is the working copy
            self.master = master
            TRACKER.register(self.master, "weights")
        else:
            self.working = kernels.launch("cast", master, self.dtype)
            self.master = (
                master
                if not self.zero
                else kernels.launch("copy", be.empty((size,), dtypes.float32), master[lo:hi])
            )
            TRACKER.register(self.master, "master")
            TRACKER.register(self.working, "weights")
        self.m = kernels.launch("fill", be.empty((size,), dtypes.float32), 0)
        self.v = kernels.launch("fill", be.empty((size,), dtypes.float32), 0)
        TRACKER.register(self.m, "adam_m")
        TRACKER.register(self.v, "adam_v")
        weights = self.master if self.working is None else self.working
        for p, (a, b) in zip(self.params, self.spans.values()):
            p.assign(weights[a:b].reshape(p.shape))
        self.grad = None  # what the backward accumulates into: all numel elements
        self.grad_shard = None  # the reduced gradient of this rank's shard (step())
        if self.zero == 2:  # what a rank keeps: its shard, copied out of the reduce-scatter
            self.grad_kept = be.empty((size,), self.dtype)
            TRACKER.register(self.grad_kept, "gradients")
        else:
            self._bind_gradients()

    def _bind_gradients(self):
        """A zeroed full-size gradient buffer, each Parameter's .grad a view of it."""
        self.grad = kernels.launch("fill", self.be.empty((self.numel,), self.dtype), 0)
        TRACKER.register(self.grad, "gradients")
        for p, (a, b) in zip(self.params, self.spans.values()):
            p.grad = Tensor(self.grad[a:b].reshape(p.shape))

    # ---- the step
    def zero_grad(self):
        with profiler.phase("optimizer"):
            if self.grad is None:
                self._bind_gradients()
            else:
                kernels.launch("fill", self.grad, 0)

    def _reduce_gradients(self):
        """Sum the gradients over the ranks -> grad_shard, the sum of this rank's shard."""
        if not self.zero:
            self.comm.all_reduce(self.grad, what="gradients")
            self.grad_shard = self.grad
            return
        self.grad_shard = self.comm.reduce_scatter(self.grad, what="gradients")
        if self.zero == 2:  # the full buffer dies here; zero_grad() makes the next one
            self.grad_shard = kernels.launch("copy", self.grad_kept, self.grad_shard)
            self.grad = None
            for p in self.params:
                p.grad = None

    def step(self, scaler=None, lr=None):
        """Reduce over the ranks, unscale, clip, check for inf/nan and update, all on the
        device. Returns the global gradient norm (unscaled, before clipping) and whether the
        step was skipped for an overflow; that read is the step's one host synchronization.
        On the meta device there is nothing to read: the step's launches run and it returns
        (None, None), norm and overflow unknown; the fp16 loss scaler, whose next scale
        depends on that overflow, is refused (meta.NoValues)."""
        meta = not backend.holds_values(self.master)
        if meta and scaler is not None:
            raise backend.meta.NoValues("the fp16 loss scaler's overflow skip")
        if lr is not None:
            self.lr = lr
        inv_scale = 1.0 / scaler.scale if scaler is not None else 1.0
        lo, hi = self.shard
        with profiler.phase("optimizer"), autograd.no_grad():
            self._reduce_gradients()
            norm_sq = kernels.launch("grad_norm_sq", self.grad_shard)  # (1,) fp32, on the device
            if self.zero:
                self.comm.all_reduce(norm_sq, what="norm²")
            b1, b2 = self.betas
            master = self.master[lo:hi] if self.working is None else self.master
            working = None if self.working is None else self.working[lo:hi]
            kernels.launch(
                "adamw_step",
                master,
                self.grad_shard,
                self.m,
                self.v,
                working,
                norm_sq,
                lr=self.lr,
                beta1=b1,
                beta2=b2,
                eps=self.eps,
                weight_decay=self.weight_decay,
                n_decay=min(max(self.n_decay - lo, 0), hi - lo),
                step=self.step_count + 1,
                inv_scale=inv_scale,
                max_norm=self.grad_clip,
            )
            if self.zero:
                self.comm.all_gather(
                    self.master if self.working is None else self.working, what="weights"
                )
        if meta:
            self.step_count += 1
            return None, None
        scaled = float(backend.of(norm_sq).to_numpy(norm_sq)[0])
        overflow = not math.isfinite(scaled)
        if scaler is not None:
            scaler.update(overflow)
        if not overflow:
            self.step_count += 1
        return (math.sqrt(scaled) * inv_scale if not overflow else float("inf")), overflow

    # ---- checkpoints (collectives under ZeRO: every rank calls them together)
    def master_state(self):
        """name -> fp32 NumPy array of the master weights (what checkpoints save as the model)."""
        return self._unflatten(self._gathered(self.master))

    def state_dict(self):
        """Arrays (m and v per parameter, fp32) and scalars (step, hyperparameters)."""
        arrays = {f"m.{k}": v for k, v in self._unflatten(self._gathered(self.m)).items()}
        arrays.update({f"v.{k}": v for k, v in self._unflatten(self._gathered(self.v)).items()})
        scalars = {
            "step": self.step_count,
            "lr": self.lr,
            "betas": list(self.betas),
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "grad_clip": self.grad_clip,
            "dtype": dtypes.name(self.dtype),
        }
        return arrays, scalars

    def load_state_dict(self, arrays, scalars):
        """Load a checkpoint's m and v (whatever the number of ranks that saved it): this rank
        keeps its shard."""
        expected = {f"{b}.{n}" for b in "mv" for n in self.names}
        if set(arrays) != expected:
            missing, extra = sorted(expected - set(arrays)), sorted(set(arrays) - expected)
            raise ValueError(
                f"optimizer state does not match the model (nothing loaded): "
                f"missing {missing[:5]}, unexpected {extra[:5]}"
            )
        params = dict(zip(self.names, self.params))
        for key, array in arrays.items():
            n = params[key[2:]].unpadded_numel()
            if array.size != n:
                raise ValueError(
                    f"optimizer state {key} has {array.size} values, the "
                    f"parameter has {n} (nothing loaded)"
                )
        lo, hi = self.shard
        for buf, letter in ((self.m, "m"), (self.v, "v")):
            flat = np.zeros(self.numel, np.float32)  # padding rows and the tail stay 0
            for name, (a, _) in self.spans.items():  # the parameter rows lead
                array = np.asarray(arrays[f"{letter}.{name}"], np.float32).reshape(-1)
                flat[a : a + array.size] = array
            kernels.launch("copy", buf, self.be.asarray(flat[lo:hi]))
        self.step_count = int(scalars["step"])

    def _gathered(self, buf):
        """The full flat buffer of which buf is this rank's shard (or buf, if it is whole)."""
        if buf.size == self.numel:
            return buf
        full = self.be.empty((self.numel,), buf.dtype)
        lo, hi = self.shard
        kernels.launch("copy", full[lo:hi], buf)
        self.comm.all_gather(full, what="checkpoint")
        return full

    def _unflatten(self, flat):
        """name -> fp32 host array of the parameter rows (no padding rows)."""
        host = backend.of(flat).to_numpy(flat)
        return {
            name: p.unpadded(host[lo:hi].reshape(p.shape)).astype(np.float32)
            for p, (name, (lo, hi)) in zip(self.params, self.spans.items())
        }
