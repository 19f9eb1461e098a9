"""The Hugging Face peer of scripts/bench.py for generation: our weights saved with our
save_pretrained, loaded as transformers' GPT2LMHeadModel, and its greedy generate with the KV
cache, timed token by token. torch and transformers are passed in: this module never imports
them, so the benchmark runs without them."""

import os
import tempfile
import time

import numpy as np

from tinygrad_like import no_grad

TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def import_transformers():
    """transformers, quiet and offline (local directories only), or None when absent."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        import transformers
    except ImportError:
        return None
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


def hf_load(transformers, torch, model, device="cpu", dtype="fp32"):
    """Save our model in Hugging Face's format and load it as GPT2LMHeadModel, in our dtype."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        hf = transformers.GPT2LMHeadModel.from_pretrained(
            tmp, dtype=getattr(torch, TORCH_DTYPES[dtype])
        )
    return hf.to(device).eval()


def hf_generate(torch, hf, prompt, new_tokens):
    """Greedy generate with the KV cache; a streamer stamps each token as it comes.
    -> (prompt seconds, decode seconds, new ids (B, new_tokens) as NumPy)."""
    from transformers.generation.streamers import BaseStreamer  # transformers is optional

    class Stamps(BaseStreamer):
        def __init__(self):
            self.times = []

        def put(self, value):
            self.times.append(time.perf_counter())

        def end(self):
            pass

    ids = torch.from_numpy(np.ascontiguousarray(prompt)).to(hf.device)
    stamps = Stamps()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            use_cache=True,
            pad_token_id=hf.config.eos_token_id,
            streamer=stamps,
        )
    t_end = time.perf_counter()
    # put() is called with the prompt first, then once per new token (each after its sync)
    first, last = stamps.times[1], stamps.times[-1] if len(stamps.times) > 2 else t_end
    return first - t0, last - first, out[:, prompt.shape[1] :].cpu().numpy()


def prompt_logits_diff(torch, hf, model, prompt):
    """Largest |logit difference| between Hugging Face's model and ours on the prompt."""
    with no_grad():
        ours = model(prompt)[0].numpy().astype(np.float32)
    with torch.no_grad():
        ids = torch.from_numpy(np.ascontiguousarray(prompt)).to(hf.device)
        theirs = hf(ids).logits.float().cpu().numpy()
    return float(np.abs(ours - theirs).max())
