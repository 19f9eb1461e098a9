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
"""
import math

import numpy as np

from tinygrad_like import Tensor, autograd, backend, dtypes, kernels, profiler
from tinygrad_like.memory import TRACKER


class AdamW:
    def __init__(self, named_params, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                 grad_clip=0.0, dtype=None):
        named = list(named_params.items() if isinstance(named_params, dict) else named_params)
        if named and not isinstance(named[0], tuple):          # plain parameters: number them
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
        self._pack()

    # ---- the flat buffers
    def _pack(self):
        be = backend.of(self.params[0].data)
        edges = np.cumsum([0] + [p.numel() for p in self.params]).tolist()
        self.spans = {name: (lo, hi) for name, lo, hi in zip(self.names, edges, edges[1:])}
        n = edges[-1]
        self.master = be.empty((n,), dtypes.float32)
        for p, (lo, hi) in zip(self.params, self.spans.values()):
            weights = kernels.launch("cast", p.data, dtypes.float32).reshape(-1)
            kernels.launch("copy", self.master[lo:hi], weights)
        if self.dtype == dtypes.float32:
            self.working = None                   # the master is the working copy
            TRACKER.register(self.master, "weights")
        else:
            self.working = kernels.launch("cast", self.master, self.dtype)
            TRACKER.register(self.master, "master")
            TRACKER.register(self.working, "weights")
        self.grad = kernels.launch("fill", be.empty((n,), self.dtype), 0)
        self.m = kernels.launch("fill", be.empty((n,), dtypes.float32), 0)
        self.v = kernels.launch("fill", be.empty((n,), dtypes.float32), 0)
        for buf, tag in ((self.grad, "gradients"), (self.m, "adam_m"), (self.v, "adam_v")):
            TRACKER.register(buf, tag)
        weights = self.master if self.working is None else self.working
        for p, (lo, hi) in zip(self.params, self.spans.values()):
            p.assign(weights[lo:hi].reshape(p.shape))
            p.grad = Tensor(self.grad[lo:hi].reshape(p.shape))

    # ---- the step
    def zero_grad(self):
        with profiler.phase("optimizer"):
            kernels.launch("fill", self.grad, 0)

    def step(self, scaler=None, lr=None):
        """Unscale, clip, check for inf/nan and update, all on the device. Returns the global
        gradient norm (unscaled, before clipping) and whether the step was skipped for an
        overflow; that read is the step's one host synchronization."""
        if lr is not None:
            self.lr = lr
        inv_scale = 1.0 / scaler.scale if scaler is not None else 1.0
        with profiler.phase("optimizer"), autograd.no_grad():
            norm_sq = kernels.launch("grad_norm_sq", self.grad)      # (1,) fp32, on the device
            b1, b2 = self.betas
            kernels.launch("adamw_step", self.master, self.grad, self.m, self.v, self.working,
                           norm_sq, lr=self.lr, beta1=b1, beta2=b2, eps=self.eps,
                           weight_decay=self.weight_decay, n_decay=self.n_decay,
                           step=self.step_count + 1, inv_scale=inv_scale,
                           max_norm=self.grad_clip)
        scaled = float(backend.of(norm_sq).to_numpy(norm_sq)[0])
        overflow = not math.isfinite(scaled)
        if scaler is not None:
            scaler.update(overflow)
        if not overflow:
            self.step_count += 1
        return (math.sqrt(scaled) * inv_scale if not overflow else float("inf")), overflow

    # ---- checkpoints
    def master_state(self):
        """name -> fp32 NumPy array of the master weights (what checkpoints save as the model)."""
        return self._unflatten(self.master)

    def state_dict(self):
        """Arrays (m and v per parameter, fp32) and scalars (step, hyperparameters)."""
        arrays = {f"m.{k}": v for k, v in self._unflatten(self.m).items()}
        arrays.update({f"v.{k}": v for k, v in self._unflatten(self.v).items()})
        scalars = {"step": self.step_count, "lr": self.lr, "betas": list(self.betas),
                   "eps": self.eps, "weight_decay": self.weight_decay,
                   "grad_clip": self.grad_clip, "dtype": dtypes.name(self.dtype)}
        return arrays, scalars

    def load_state_dict(self, arrays, scalars):
        expected = {f"{b}.{n}" for b in "mv" for n in self.names}
        if set(arrays) != expected:
            missing, extra = sorted(expected - set(arrays)), sorted(set(arrays) - expected)
            raise ValueError(f"optimizer state does not match the model (nothing loaded): "
                             f"missing {missing[:5]}, unexpected {extra[:5]}")
        params = dict(zip(self.names, self.params))
        for key, array in arrays.items():
            n = params[key[2:]].unpadded_numel()
            if array.size != n:
                raise ValueError(f"optimizer state {key} has {array.size} values, the "
                                 f"parameter has {n} (nothing loaded)")
        be = backend.of(self.master)
        for key, array in arrays.items():
            buf = self.m if key[0] == "m" else self.v
            lo = self.spans[key[2:]][0]   # the parameter rows lead; padding rows stay 0
            kernels.launch("copy", buf[lo:lo + array.size],
                           be.asarray(np.asarray(array, np.float32).reshape(-1)))
        self.step_count = int(scalars["step"])

    def _unflatten(self, flat):
        """name -> fp32 host array of the parameter rows (no padding rows)."""
        host = backend.of(flat).to_numpy(flat)
        return {name: p.unpadded(host[lo:hi].reshape(p.shape)).astype(np.float32)
                for p, (name, (lo, hi)) in zip(self.params, self.spans.items())}
