"""The PyTorch peer of scripts/bench.py: a compact GPT-2 in PyTorch eager with our parameter
names and layouts, loaded with our weights, and its training step, on the CPU or a GPU.

On a GPU it is the usual fast PyTorch recipe: bf16 autocast (fp32 weights, bf16 matmuls),
torch.nn.functional.scaled_dot_product_attention (flash attention) and the fused
torch.optim.AdamW; on the CPU the same model in fp32 with AdamW's default (for-each)
implementation. torch is passed in: this module never imports it, so the benchmark runs
without it.
"""

import numpy as np

PEER_DTYPES = ("fp32", "bf16")  # fp16 would need torch's GradScaler too: no peer here


def torch_model_class(torch):
    """GPT-2 with Linear weights stored (in, out) and used as x @ W (Hugging Face's Conv1D),
    the LM head tied to wte."""
    nn, F = torch.nn, torch.nn.functional

    class Conv1D(nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(n_in, n_out))
            self.bias = nn.Parameter(torch.zeros(n_out))

        def forward(self, x):
            shape = x.shape[:-1] + (self.weight.shape[1],)
            return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)

    class Attention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.n_head = config.n_head
            self.c_attn = Conv1D(config.n_embd, 3 * config.n_embd)
            self.c_proj = Conv1D(config.n_embd, config.n_embd)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (
                t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)
            )
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    class MLP(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.c_fc = Conv1D(config.n_embd, 4 * config.n_embd)
            self.c_proj = Conv1D(4 * config.n_embd, config.n_embd)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self, config):
            super().__init__()
            eps = config.layer_norm_epsilon
            self.ln_1 = nn.LayerNorm(config.n_embd, eps=eps)
            self.attn = Attention(config)
            self.ln_2 = nn.LayerNorm(config.n_embd, eps=eps)
            self.mlp = MLP(config)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Transformer(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.wte = nn.Embedding(config.vocab_size, config.n_embd)
            self.wpe = nn.Embedding(config.n_positions, config.n_embd)
            self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
            self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    class TorchGPT2(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.transformer = Transformer(config)

        def forward(self, idx, targets=None):
            tr = self.transformer
            T = idx.shape[1]
            x = tr.wte(idx) + tr.wpe(torch.arange(T, device=idx.device))
            for block in tr.h:
                x = block(x)
            logits = F.linear(tr.ln_f(x), tr.wte.weight)  # tied LM head
            loss = None
            if targets is not None:
                loss = F.cross_entropy(
                    logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1
                )
            return logits, loss

    return TorchGPT2


class TorchPeer:
    """The model with our weights (copied), torch.optim.AdamW (decay on the 2-D parameters only,
    betas (0.9, 0.95), fused on a GPU) and the step, in fp32 or bf16 autocast; compile=True
    wraps the model in torch.compile (the first steps then take the compilation)."""

    def __init__(
        self,
        torch,
        config,
        state,
        device="cpu",
        dtype="fp32",
        lr=1e-4,
        weight_decay=0.1,
        grad_clip=1.0,
        compile=False,
    ):
        if dtype not in PEER_DTYPES:
            raise ValueError(f"the PyTorch peer runs in {' or '.join(PEER_DTYPES)}, not {dtype}")
        self.torch, self.grad_clip = torch, grad_clip
        self.device = torch.device(device)
        self.autocast = dict(
            device_type=self.device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"
        )
        model = torch_model_class(torch)(config)
        own = model.state_dict()
        if set(own) != set(state):
            raise RuntimeError(
                f"torch model keys differ from ours: {sorted(set(own) ^ set(state))[:5]}"
            )
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.from_numpy(np.array(state[name], dtype=np.float32, copy=True)))
        self.model = model.to(self.device)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": weight_decay},
                {"params": rest, "weight_decay": 0.0},
            ],
            lr=lr,
            betas=(0.9, 0.95),
            eps=1e-8,
            fused=self.device.type == "cuda",
        )
        self.forward = torch.compile(self.model) if compile else self.model

    def batch(self, x, y):
        """NumPy (x, y) -> tensors on the peer's device."""
        return (self.torch.from_numpy(x).to(self.device), self.torch.from_numpy(y).to(self.device))

    def loss(self, x, y):
        with self.torch.no_grad(), self.torch.autocast(**self.autocast):
            return float(self.forward(x, y)[1].item())

    def train_step(self, x, y):
        """Forward, backward, clipping, AdamW step and zero_grad, finished on the device.
        -> the loss."""
        torch = self.torch
        with torch.autocast(**self.autocast):
            _, loss = self.forward(x, y)
        loss.backward()
        value = loss.item()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return value

    def census(self, x, y, rows=25):
        """torch.profiler's table of one training step, by self time (the GPU's, on a GPU)."""
        profiler, gpu = self.torch.profiler, self.device.type == "cuda"
        kinds = profiler.ProfilerActivity
        with profiler.profile(activities=[kinds.CPU, kinds.CUDA] if gpu else [kinds.CPU]) as prof:
            self.train_step(x, y)
        key = "self_device_time_total" if gpu else "self_cpu_time_total"
        return prof.key_averages().table(sort_by=key, row_limit=rows)
