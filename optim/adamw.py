"""AdamW over flat buffers: one fused kernel updates every parameter.

The model's parameters are views of one flat buffer in its working dtype, which the model took
before the optimizer was made (nn/flat.py: Module.flatten_parameters, nn.build(config,
dtype=...)): AdamW views that buffer as its working weights, and allocates the rest, each one
flat buffer of the same layout: the fp32 master, m, v and the gradients (each Parameter's .grad
is a view of the gradient buffer, as PyTorch's DDP does with gradient_as_bucket_view). It never
rebinds a parameter. The persistent state is then exactly:

    dtype   working weights   gradients   master   m    v    = bytes per parameter
    fp32    4                 4           -        4    4    = 16 (the weights are the master)
    fp16    2                 2           4        4    4    = 16
    bf16    2                 2           4        4    4    = 16

The master starts from `master` (name -> fp32 values: a checkpoint's, or a fresh model's taken
before its cast, so that a 2-byte dtype loses nothing) or else from the weights themselves; the
working weights are then set to its rounding, as every step leaves them. A step is three
launches whatever the model: the gradient's sum of squares (for clipping and the overflow
check), the fused update, and (in zero_grad) one fill of the gradient buffer.

A parameter stored with zero padding rows (Parameter.rows: the tied wte, padded to an aligned
vocabulary) is laid out whole, padding included: those elements are real memory in every buffer.
Their gradient is always zero, so m, v and the weights stay exactly zero there (decay keeps 0 at
0). The checkpoint state (master_state, state_dict) holds the parameter rows only.

Data parallel (comm: a tinygrad_like.distributed communicator of R ranks), ZeRO stage `zero`:
    0 (DDP)  the gradient buffer is all-reduced; every rank updates everything
    1        each rank keeps master, m and v of one shard only (1/R of the flat buffers, which
             the layout pads to R equal parts: flatten_parameters(dtype, shards=R)): the
             gradients are reduce-scattered (each rank needs the sum of its shard only, so an
             all-reduce would send half again as much for nothing), the rank updates its shard
             and all-gathers the working weights: the bytes DDP sends
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
from tinygrad_like.kernels.adamw.spec import N_CONSTANTS, Hyper
from tinygrad_like.kernels.adamw.spec import constants as adamw_constants
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
        master=None,
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
        if zero not in (0, 1, 2):
            raise ValueError(f"ZeRO stage must be 0, 1 or 2, got {zero}")
        self.comm, self.zero = comm or Communicator(), zero
        self.flat = _flat_of([p for _, p in named], self.comm.size if zero else 1)
        order = {id(p): i for i, p in enumerate(self.flat.params)}
        named.sort(key=lambda kv: order[id(kv[1])])  # the layout's order
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.spans = dict(zip(self.names, self.flat.spans))
        # the layout puts the 2-D weights (matmuls, embeddings) first: decay covers a prefix,
        # not the biases or norm gains after it
        self.n_decay = sum(p.numel() for p in self.params if p.ndim >= 2)
        self.dtype = self.flat.data.dtype
        self._allocate(master)

    # ---- the flat buffers
    def _allocate(self, master):
        be = self.be = backend.of(self.flat.data)
        self.numel, self.padding = self.flat.numel, self.flat.padding
        # the shard this rank updates: all of it (ZeRO-0) or one of R equal parts
        size = self.numel // self.comm.size if self.zero else self.numel
        lo = self.comm.rank * size if self.zero else 0
        lo, hi = self.shard = (lo, lo + size)
        full = self._full_master(master)
        if self.dtype == dtypes.float32:  # the weights are the master (tagged "weights")
            self.working, self.master = None, full
        else:  # the model's weights, set to the master's rounding
            self.working = self.flat.data
            kernels.launch("copy", self.working, kernels.launch("cast", full, self.dtype))
            self.master = (
                full
                if not self.zero
                else kernels.launch("copy", be.empty((size,), dtypes.float32), full[lo:hi])
            )
            TRACKER.register(self.master, "master")
        self.m = kernels.launch("fill", be.empty((size,), dtypes.float32), 0)
        self.v = kernels.launch("fill", be.empty((size,), dtypes.float32), 0)
        TRACKER.register(self.m, "adam_m")
        TRACKER.register(self.v, "adam_v")
        self.constants = be.empty((N_CONSTANTS,), np.float64)  # each step's, on the device
        self.grad = None  # what the backward accumulates into: all numel elements
        self.grad_shard = None  # the reduced gradient of this rank's shard (step())
        if self.zero == 2:  # what a rank keeps: its shard, copied out of the reduce-scatter
            self.grad_kept = be.empty((size,), self.dtype)
            TRACKER.register(self.grad_kept, "gradients")
        else:
            self._bind_gradients()

    def _full_master(self, master):
        """(numel,) fp32: all the master weights, rank 0's on every rank: master's values (name
        -> fp32 array) or else the weights' own; in fp32 the weights' buffer itself."""
        weights, fp32 = self.flat.data, dtypes.float32
        if master is None:
            full = weights if self.dtype == fp32 else kernels.launch("cast", weights, fp32)
        else:
            values = self.be.asarray(self._host_flat(master, "master weights"))
            full = kernels.launch("copy", weights, values) if self.dtype == fp32 else values
        self.comm.broadcast(full, what="weights")  # every rank starts from rank 0's
        return full

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
            # a world of one has nothing to sum: no host call (which would cut a CUDA graph)
            if self.comm.size > 1:
                kernels.on_host(self.comm.all_reduce, self.grad, "gradients")
            self.grad_shard = self.grad
            return
        self.grad_shard = kernels.on_host(self.comm.reduce_scatter, self.grad, "gradients")
        if self.zero == 2:  # the full buffer dies here; zero_grad() makes the next one
            self.grad_shard = kernels.launch("copy", self.grad_kept, self.grad_shard)
            self.grad = None
            for p in self.params:
                p.grad = None

    def step(self, scaler=None, lr=None):
        """Reduce over the ranks, unscale, clip, check for inf/nan and update, all on the
        device. Returns the global gradient norm (unscaled, before clipping) and whether the
        step was skipped for an overflow; that read is the step's one host synchronization.
        On a device that holds no values (meta) there is nothing to read: the step's launches
        run and it returns (None, None), norm and overflow unknown; the fp16 loss scaler, whose
        next scale depends on that overflow, is refused (require_values: NoValues). What the
        host decides (this step's scalars, the collectives, the read and what follows from it)
        are host calls (kernels.on_host), which a captured training step's replay runs again;
        lr, when given, is set before them (a replay's caller sets optimizer.lr)."""
        if scaler is not None:
            self.be.require_values("the fp16 loss scaler's overflow skip")
        if lr is not None:
            self.lr = lr
        hyper = kernels.on_host(self._hyper, scaler, self.constants)
        lo, hi = self.shard
        with profiler.phase("optimizer"), autograd.no_grad():
            self._reduce_gradients()
            norm_sq = kernels.launch("grad_norm_sq", self.grad_shard)  # (1,) fp32, on the device
            if self.zero:
                kernels.on_host(self.comm.all_reduce, norm_sq, "norm²")
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
                self.constants,
            )
            if self.zero:
                weights = self.master if self.working is None else self.working
                kernels.on_host(self.comm.all_gather, weights, "weights")
        return kernels.on_host(self._finish, norm_sq, scaler, hyper)

    def _hyper(self, scaler, constants):
        """This step's scalars (adamw.spec.Hyper: lr, the step's number, 1 / the loss scale),
        written into constants, the device buffer adamw_step reads (spec.constants), -> them."""
        hyper = self._scalars(scaler)
        if self.be.HOLDS_VALUES:
            constants[...] = self.be.asarray(adamw_constants(hyper))
        return hyper

    def _scalars(self, scaler):
        lo, hi = self.shard
        b1, b2 = self.betas
        return Hyper(
            lr=self.lr,
            beta1=b1,
            beta2=b2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            n_decay=min(max(self.n_decay - lo, 0), hi - lo),
            step=self.step_count + 1,
            inv_scale=1.0 / scaler.scale if scaler is not None else 1.0,
            max_norm=self.grad_clip,
        )

    def _finish(self, norm_sq, scaler, hyper):
        """The step's host side after its kernels: read the norm (the one host sync), update
        the loss scaler, count the step -> (norm, overflow), (None, None) on meta."""
        if not self.be.HOLDS_VALUES:
            self.step_count += 1
            return None, None
        scaled = float(backend.of(norm_sq).to_numpy(norm_sq)[0])
        overflow = not math.isfinite(scaled)
        if scaler is not None:
            scaler.update(overflow)
        if not overflow:
            self.step_count += 1
        return (math.sqrt(scaled) * hyper.inv_scale if not overflow else float("inf")), overflow

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
        _check_names(arrays, expected, "optimizer state")
        lo, hi = self.shard
        flats = [self._host_flat(arrays, "optimizer state", prefix) for prefix in ("m.", "v.")]
        for buf, flat in zip((self.m, self.v), flats):  # all checked first: nothing half-loaded
            kernels.launch("copy", buf, self.be.asarray(flat[lo:hi]))
        self.step_count = int(scalars["step"])

    def _host_flat(self, arrays, what, prefix=""):
        """(numel,) fp32 host array of arrays[prefix + name] (each the parameter rows, as state
        dicts hold them) laid out as the flat buffers are, zero in the padding rows and the
        tail; ValueError (nothing loaded) for a missing name or a wrong size."""
        _check_names(
            {k for k in arrays if k.startswith(prefix)}, {prefix + n for n in self.names}, what
        )
        flat = np.zeros(self.numel, np.float32)
        for name, p in zip(self.names, self.params):
            array = np.asarray(arrays[prefix + name], np.float32).reshape(-1)
            if array.size != p.unpadded_numel():
                raise ValueError(
                    f"{what} {prefix + name} has {array.size} values, the parameter has "
                    f"{p.unpadded_numel()} (nothing loaded)"
                )
            lo = self.spans[name][0]
            flat[lo : lo + array.size] = array  # the parameter rows lead
        return flat

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


def _flat_of(params, shards):
    """The FlatParameters params are laid out in, all of it and nothing else, in equal shards
    (ValueError otherwise: the model takes its working dtype, and so its layout, first)."""
    flat = params[0].flat
    ids = {id(p) for p in params}
    if flat is None or len(ids) != len(flat.params) or any(p.flat is not flat for p in params):
        raise ValueError(
            "AdamW views the model's working weights, which must be one flat buffer of exactly "
            "these parameters: lay them out first (model.flatten_parameters(dtype), "
            "nn.build(config, dtype=...), nn.flat.flatten_parameters(params, dtype))"
        )
    if flat.numel % shards:
        raise ValueError(
            f"ZeRO over {shards} ranks splits the flat buffers into {shards} equal shards: lay "
            f"the parameters out for them (flatten_parameters(dtype, shards={shards}))"
        )
    return flat


def _check_names(given, expected, what):
    """ValueError naming what is missing from given and what is unexpected in it."""
    if set(given) != expected:
        missing, extra = sorted(expected - set(given)), sorted(set(given) - expected)
        raise ValueError(
            f"{what} does not match the model (nothing loaded): "
            f"missing {missing[:5]}, unexpected {extra[:5]}"
        )
