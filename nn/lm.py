"""What a causal language model is whatever its family: CausalLM, the base class of GPT2 and
Llama, with the input checks, the LM head and its loss, generation with a KV cache, and the
Hugging Face directory format (nn/hf.py reads and writes either family's).

A family supplies forward(idx, targets, cache, last_only) -> (logits, loss), built from
_positions() (the checks) and _head() (the head and the loss), and get_input_embeddings()
(Hugging Face's name: the token embedding, whose weight tells the device and dtype the model
runs in). Shapes: B batch, T tokens, C channels, Hkv key/value heads of D channels, V vocab,
Vp = V padded (nn/config.py).
"""

import functools
import math

import numpy as np

import tinygrad_like.functional as F
from tinygrad_like import Tensor, autograd, backend, dtypes, graph, kernels
from tinygrad_like.kernels.kvcache.spec import KV_FORMATS
from tinygrad_like.memory import TRACKER

from . import hf
from .layers import building_on
from .module import Module
from .options import ExecutionOptions
from .quant_checkpoint import load_quantized
from .sampling import check_sampling, sample

# The formats a KV cache may be in: the training dtypes, and the 8-bit floats that store a byte a
# value and an fp32 scale per row of D (inference only: the kernels of kernels/kvcache).
KV_DTYPES = dtypes.TRAINING + KV_FORMATS


def kv_bytes_per_element(kv_dtype, head_dim):
    """Bytes a cache in kv_dtype (a KV_DTYPES name or a dtype) holds per key or value element:
    the dtype's itemsize, or an fp8 code and its share of its row's fp32 scale, 1 + 4 / D;
    config.kv_cache_bytes_per_token(this) is then the bytes per token."""
    if kv_dtype in KV_FORMATS:
        return 1 + 4 / head_dim
    return dtypes.as_dtype(kv_dtype).itemsize


def kv_name(kv_dtype):
    """The short name of a cache's dtype or format (fp32, bf16, fp8_e4m3, ...)."""
    return kv_dtype if kv_dtype in KV_FORMATS else dtypes.name(dtypes.as_dtype(kv_dtype))


class KVCache:
    """Keys and values of the positions seen so far, per layer: (B, Hkv, max_len, D) each
    (Hkv = H for GPT-2; Llama's grouped-query attention stores only its Hkv heads).
    Under no_grad only: the prompt fills it once, then each decode step appends one position.
    Its kernels (kernels/kvcache) take the whole cache and the positions written and attended
    from as a device array, so that every decode step launches the same kernels on the same
    arrays: a step that can be captured and replayed (tinygrad_like.compile).
    dtype: the cache's number format (default the model's, like's: fp32 for a quantized weight,
    the activations' dtype), one of KV_DTYPES: a narrower one holds and streams fewer bytes per
    token. In an fp8 format (fmt, else None) k and v hold uint8 codes and k_scales, v_scales
    (B, Hkv, max_len) fp32 one scale per position of a head: 2 Hkv (D + 4) bytes per token per
    layer. Its buffers are the memory tracker's "kv_cache"."""

    def __init__(self, config, batch, max_len, like, dtype=None):
        self.fmt = dtype if dtype in KV_FORMATS else None
        if dtype is not None and self.fmt is None and _dtype_name(dtype) not in dtypes.TRAINING:
            raise ValueError(f"a KV cache in {dtype}: use one of {', '.join(KV_DTYPES)}")
        self.dtype = np.dtype(np.uint8) if self.fmt else dtypes.as_dtype(dtype or like.dtype)
        shape = (batch, config.n_kv_head, max_len, config.head_dim)
        empty = backend.get(like.device).empty
        self.k = [empty(shape, self.dtype) for _ in range(config.n_layer)]
        self.v = [empty(shape, self.dtype) for _ in range(config.n_layer)]
        scaled = range(config.n_layer if self.fmt else 0)
        self.k_scales = [empty(shape[:-1], dtypes.float32) for _ in scaled]
        self.v_scales = [empty(shape[:-1], dtypes.float32) for _ in scaled]
        for a in self.k + self.v + self.k_scales + self.v_scales:
            TRACKER.register(a, "kv_cache")
        self.length = 0  # positions already stored (before the current forward)
        self.max_len = max_len

    def advance(self, tokens):
        """The positions stored grow by tokens (host state: a captured step's replay runs it
        in its place, kernels.on_host), or ValueError past the cache's max_len: on CUDA the
        attention reads the positions on the device only, so this is their check there (a
        replayed CUDA graph has written its step by then)."""
        if self.length + tokens > self.max_len:
            raise ValueError(
                f"the KV cache holds {self.max_len} positions: {self.length} stored and "
                f"{tokens} more do not fit (make the cache longer)"
            )
        self.length += tokens

    def _write(self, layer, k, v, positions):
        """Store this step's k, v (B, Hkv, T, D) at positions (T,): cast to the cache's dtype
        by a counted kernel when it differs, or, in an fp8 cache, each position's row quantized
        by the counted kv_quantize kernel (codes and its scale)."""
        if self.fmt is None:
            for buf, new in ((self.k[layer], k.data), (self.v[layer], v.data)):
                if new.dtype != self.dtype:
                    new = kernels.launch("cast", new, self.dtype)
                kernels.launch("kv_write", buf, new, positions)
            return
        for codes, scales, new in (
            (self.k[layer], self.k_scales[layer], k.data),
            (self.v[layer], self.v_scales[layer], v.data),
        ):
            new_codes, new_scales = kernels.launch("kv_quantize", new, self.fmt)
            kernels.launch("kv_write", codes, new_codes, positions)
            kernels.launch("kv_write", scales, new_scales, positions)

    def attention(self, layer, q, k, v, positions):
        """Causal attention of q (B, H, T, D) at positions (T,) over the cache after writing
        k, v there: one kv_attention launch in the cache's dtype (q cast to it, the output cast
        back to q's), so the cache is read in its own format, never a widened copy of it; an
        fp8 cache one qattention launch, which decodes the codes as it reads them, out in q's
        dtype. Both the flash kernels' arithmetic, whatever the model's attention option."""
        if autograd.is_grad_enabled() and q.requires_grad:
            raise RuntimeError(
                f"a KV cache in {kv_name(self.fmt or self.dtype)} is inference only: run the "
                "model under no_grad()"
            )
        self._write(layer, k, v, positions)
        scale = 1.0 / math.sqrt(q.shape[-1])
        if self.fmt is None:
            out = kernels.launch(
                "kv_attention",
                q.to(self.dtype).data,
                self.k[layer],
                self.v[layer],
                positions,
                scale,
            )
            return Tensor(out).to(q.dtype)
        args = (self.k[layer], self.k_scales[layer], self.v[layer], self.v_scales[layer])
        return Tensor(kernels.launch("qattention", q.data, *args, self.fmt, positions, scale))


def _dtype_name(dtype):
    """A dtype's short name, or None for what is no dtype (e.g. "fp8")."""
    try:
        return dtypes.name(dtypes.as_dtype(dtype))
    except ValueError:
        return None


class CausalLM(Module):
    """config: what the model is (its shapes); options: how it runs (ExecutionOptions, the
    training run's defaults when None), read by its modules as they are built. A family
    supplies config_class (the config it is built from) and make_modules(config, rng), which
    makes its modules drawing from rng in order; they are made for device (on meta, shape-only
    parameters with nothing drawn) and then moved there."""

    config_class = None

    def __init__(self, config, seed=0, device=None, options=None):
        super().__init__()
        self.config = config
        self.options = options or ExecutionOptions()
        device = device or backend.default_device()
        with building_on(device):
            self.make_modules(config, np.random.default_rng(seed))
        self.name_scopes()
        self.to(device=device)

    def make_modules(self, config, rng):
        raise NotImplementedError

    def get_input_embeddings(self):
        raise NotImplementedError

    # ---- the pieces of forward
    def _positions(self, idx, cache, cache_position=None):
        """idx (B, T) checked -> (idx: an array of some device as it is (a Tensor's data),
        host data as a NumPy array; B, T, the tokens' positions (T,) int64: cache_position when
        given (a device array, as a captured decode step passes its own), else the cache's next
        T positions on the model's device, or without a cache 0 ... T - 1 (_first_positions). Device
        ids stay there: a captured step's replay reads its input buffer, and a CUDA graph's
        capture may not copy from the host."""
        name = type(self).__name__
        idx = idx.data if isinstance(idx, Tensor) else idx
        if not backend.is_array(idx):
            idx = np.asarray(idx)
        if idx.ndim != 2:
            raise ValueError(f"{name} expects token ids of shape (B, T), got {idx.shape}")
        B, T = idx.shape
        if T == 0:
            raise ValueError(f"{name} got an empty sequence (T = 0): give at least one token")
        start = cache.length if cache is not None else 0
        if start + T > self.config.n_positions:
            raise ValueError(
                f"sequence of {start + T} tokens is longer than the context of "
                f"{self.config.n_positions}: shorten it (or --seq-len)"
            )
        if cache_position is None:
            be = backend.get(self.get_input_embeddings().weight.device)
            if cache is None:
                cache_position = _first_positions(T, be)
            else:
                cache_position = be.asarray(np.arange(start, start + T))
        return idx, B, T, cache_position

    def _head(self, x, weight, targets, last_only):
        """The LM head over the final hidden states x (B, T, C) with weight (Vp, C) (logits =
        x weight^T), and the mean cross-entropy against targets (B, T) -> (logits, loss).
        last_only computes logits for the last position only (generation). The head computes
        (B, T, Vp) padded logits; the loss reads them over the first V columns, and the logits
        returned are a view of those V columns (no copy). With the fused head (options.lm_head)
        and targets, the head and the loss are one record that never makes the logits
        (F.linear_cross_entropy, in options.lm_head_design), and the logits returned are None,
        as llm.c and Liger do; without targets (generation) the head is the plain one."""
        B, T = x.shape[:2]
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C)
        V = self.config.vocab_size
        if targets is not None:
            if not backend.is_array(targets):  # host data (a list); arrays stay on their device
                targets = np.asarray(targets)
            if targets.shape != (B, T):
                raise ValueError(f"targets of shape {targets.shape} do not match ids {(B, T)}")
            if self.options.lm_head == "fused":
                with autograd.scope("lm_head"):  # the head and the loss
                    return None, F.linear_cross_entropy(
                        x.reshape(B * T, -1),
                        weight,
                        targets.reshape(-1),
                        n_classes=V,
                        design=self.options.lm_head_design,
                    )
        with autograd.scope("lm_head"):
            padded = F.linear(x, weight, transposed=True)  # (B, T, Vp)
            logits = padded[:, :, :V]  # (B, T, V), a view
        loss = None
        if targets is not None:
            with autograd.scope("loss"):
                loss = F.cross_entropy(padded.reshape(B * T, -1), targets.reshape(-1), n_classes=V)
        return logits, loss

    # ---- Hugging Face format
    @classmethod
    def from_pretrained(cls, path, dtype=None, device=None, options=None):
        """The model in a Hugging Face directory of this family (or a training checkpoint, or
        a quantized checkpoint: nn/quant_checkpoint.py, its weights never in fp32), run with
        options (ExecutionOptions)."""
        config = hf.read_config(path)
        if not isinstance(config, cls.config_class):
            raise ValueError(
                f"{path} holds a {hf.family(config)} checkpoint, not a {cls.__name__} one: "
                "load it with nn.from_pretrained (which picks the family)"
            )
        if hf.read_quantization(path) is not None:
            return load_quantized(cls, path, config, dtype, device, options)
        model = cls(config, options=options)
        model.load_state_dict(hf.read_state(path))
        return model.to(dtype=dtype, device=device)

    def save_pretrained(self, path, state=None):
        """Write config.json and model.safetensors (nn/hf.py). state: name -> array to write
        instead of the model's own weights (the fp32 master)."""
        hf.save_pretrained(path, self.config, self.state_dict() if state is None else state)

    # ---- generation
    def generate(
        self,
        idx,
        max_new_tokens,
        temperature=1.0,
        top_k=None,
        top_p=None,
        seed=None,
        kv_dtype=None,
        compile=False,
    ):
        """-> (B, T + max_new_tokens) int64 ids: the prompt then the sampled continuation."""
        idx = _prompt(idx)
        args = (temperature, top_k, top_p, seed, kv_dtype, compile)
        new = list(self.generate_stream(idx, max_new_tokens, *args))
        return np.concatenate([idx] + [t[:, None] for t in new], axis=1)

    def generate_stream(
        self,
        idx,
        max_new_tokens,
        temperature=1.0,
        top_k=None,
        top_p=None,
        seed=None,
        kv_dtype=None,
        compile=False,
    ):
        """An iterator over each new token column (B,) as it is sampled. The prompt goes
        through the model once, filling the KV cache (in kv_dtype, default the model's dtype);
        then every step feeds just the one new token. The B prompts are of one length T (the
        attention is causal with no padding mask: a batch is never padded). compile: the decode
        step captured and replayed (tinygrad_like.compile; its first two tokens run eagerly),
        the same tokens. Bad arguments raise here, not at the first next()."""
        idx = _prompt(idx)
        check_sampling(temperature, top_k, top_p)
        B, T = idx.shape
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if T + max_new_tokens > self.config.n_positions:
            raise ValueError(
                f"prompt of {T} tokens + {max_new_tokens} new tokens = "
                f"{T + max_new_tokens} is longer than the context of "
                f"{self.config.n_positions}"
            )
        like = self.get_input_embeddings().weight
        cache = KVCache(self.config, B, T + max_new_tokens, like, kv_dtype)
        step = self.decode_step(cache)
        steps = (step, graph.compile(step) if compile else step)  # the prompt's, then a token's
        rng = np.random.default_rng(seed)
        return self._decode(idx, max_new_tokens, cache, steps, temperature, top_k, top_p, rng)

    def decode_step(self, cache):
        """The step that feeds tokens (B, T) at positions (T,), device arrays, through the model
        and its cache -> the last position's logits, a device array (B, 1, V), under no_grad
        with every module in eval mode (tinygrad_like.compile can capture it)."""
        modules = [m for _, m in self.named_modules()]

        def step(tokens, positions):
            modes = [m.training for m in modules]
            for m in modules:
                object.__setattr__(m, "training", False)
            try:
                # an overflow is not warned about on the way: _decode checks the logits
                with autograd.no_grad(), np.errstate(over="ignore", invalid="ignore"):
                    logits, _ = self(tokens, cache=cache, last_only=True, cache_position=positions)
                return logits.data
            finally:
                for m, mode in zip(modules, modes):
                    object.__setattr__(m, "training", mode)

        return step

    def _decode(self, idx, max_new_tokens, cache, steps, temperature, top_k, top_p, rng):
        be = backend.get(self.get_input_embeddings().weight.device)
        feed = idx
        for i in range(max_new_tokens):
            T = feed.shape[1]
            positions = be.asarray(np.arange(cache.length, cache.length + T))
            logits = steps[i > 0](be.asarray(feed), positions)  # (B, 1, V)
            logits = be.to_numpy(logits)[:, -1, :].astype(np.float32)  # (B, V) fp32, host
            if not np.isfinite(logits).all():  # else argmax picks token 0, sampling fails
                raise ValueError(
                    _non_finite(self.get_input_embeddings().weight.dtype, cache.length)
                )
            token = sample(logits, temperature, top_k, top_p, rng)  # (B,)
            yield token  # outside no_grad/eval: the caller's code runs as usual
            feed = token[:, None]


@functools.lru_cache(maxsize=None)
def _first_positions(T, be):
    """0 ... T - 1, the same array at every call (a captured training step's kernels read it as
    a constant): on the host, read-only, where the device's memory is the host's or holds no
    values (meta), else copied once to the device (be: its backend module)."""
    positions = np.arange(T)
    positions.flags.writeable = False
    return positions if be.HOST_MEMORY or not be.HOLDS_VALUES else be.asarray(positions)


def _non_finite(dtype, tokens):
    """The error for inf or nan logits: fp16 overflows beyond 65,504, where bf16 keeps fp32's
    range; an fp32 forward that overflows has no wider dtype to go to."""
    what = f"the {dtypes.name(dtype)} forward gave inf or nan logits after {tokens} tokens"
    if dtype == dtypes.float16:
        return f"{what}: fp16 overflows beyond 65,504; use dtype bf16 (fp32's range) or fp32"
    if dtype == dtypes.bfloat16:
        return f"{what}: use dtype fp32 (or check the checkpoint's weights for inf or nan)"
    return f"{what}: the weights themselves overflow (a diverged checkpoint?)"


def _prompt(idx):
    """Token ids as a (B, T) int array with T >= 1 (a 1-D prompt is one sequence)."""
    idx = np.asarray(idx)
    if idx.ndim == 1:
        idx = idx[None]
    if idx.ndim != 2 or idx.shape[1] == 0:
        raise ValueError(
            f"a prompt needs at least one token, as ids of shape (T,) or (B, T); "
            f"got shape {idx.shape}"
        )
    return idx
