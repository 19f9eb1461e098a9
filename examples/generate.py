"""Sample text from a GPT-2 or Llama checkpoint: one written by examples/train_gpt2.py (its --out
folder), by save_pretrained, or a Hugging Face GPT-2 or Llama directory. Streams tokens as they
come, then prints prompt and generation speed."""

import itertools
import sys
import time

import numpy as np

from nn import from_pretrained
from nn.hf import read_config
from nn.sampling import check_sampling
from nn.tokenizer import get_tokenizer
from tinygrad_like import backend
from training import fits
from training.args import ArgumentParser, user_errors
from training.checkpoint import find_checkpoint, verify

NO_CHECKPOINT = """error: no --checkpoint given. Either
  train one:   python examples/train_gpt2.py --out out   (then --checkpoint out)
  or point at GPT-2 weights you have: a Hugging Face GPT-2 directory with config.json and
  model.safetensors, e.g. --checkpoint ~/models/gpt2"""


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    p.add_argument("--checkpoint", help="folder with config.json + model.safetensors")
    p.add_argument("--prompt", default="\n", help="text to continue (default a newline)")
    p.add_argument("--max-new-tokens", type=int, default=100, help="tokens to sample (default 100)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=200, help="sample from the k likeliest (200)")
    p.add_argument("--top-p", type=float, help="sample from the smallest set of this mass")
    p.add_argument("--num-samples", type=int, default=1, help="samples, one after another")
    p.add_argument("--seed", type=int, default=1337, help="sampling seed (sample i uses seed + i)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when a GPU is usable)")
    p.add_argument("--dtype", default="fp32", help="fp32, fp16 or bf16 weights (default fp32)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not args.checkpoint:
        print(NO_CHECKPOINT, file=sys.stderr)
        sys.exit(2)
    with user_errors():
        if args.max_new_tokens <= 0 or args.num_samples <= 0:
            raise ValueError("--max-new-tokens and --num-samples must be positive")
        check_sampling(
            args.temperature, args.top_k, args.top_p, names=("--temperature", "--top-k", "--top-p")
        )
        device = backend.check_device(args.device or backend.default_device())
        ckpt = find_checkpoint(args.checkpoint)
        verify(ckpt)  # a training checkpoint's sha256 sums (a flipped byte still loads)
        tok = get_tokenizer()
        prompt = np.array([tok.encode(args.prompt, allow_special=True)])
        if prompt.size == 0:
            raise ValueError("--prompt is empty: give at least one character")
        # all checked before the model is loaded and the prompt printed: an error never
        # follows half an output
        config, tokens = read_config(ckpt), prompt.shape[1] + args.max_new_tokens
        config.check_context(
            tokens,
            f"--prompt of {prompt.shape[1]} tokens + --max-new-tokens {args.max_new_tokens} =",
        )
        fits.check(
            fits.generation_bytes(config, args.dtype, tokens, device),
            device,
            f"loading {ckpt} in {args.dtype} and generating {tokens} positions",
            "use a smaller checkpoint or fewer --max-new-tokens",
        )
        model = from_pretrained(ckpt, dtype=args.dtype, device=device)  # either family
    for i in range(args.num_samples):
        title = f"--- sample {i + 1}" if args.num_samples > 1 else "---"
        with user_errors():  # the dtype's overflow (inf logits) found while sampling
            stream(model, tok, prompt, args, args.seed + i, title)


def stream(model, tok, prompt, args, seed, title):
    """Print the title and the prompt, then each token as it is sampled; then the two speeds.
    The first token comes before anything is printed: a forward that fails on the prompt prints
    only its error, and one that fails later ends the line first."""
    tokens = model.generate_stream(
        prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p, seed
    )
    t0 = time.perf_counter()
    first = next(tokens)
    t_first = time.perf_counter()
    print(title)
    print(args.prompt, end="", flush=True)
    ids, shown = [], ""
    try:
        for token in itertools.chain([first], tokens):
            ids.append(int(token[0]))
            text = tok.decode(ids)  # decode the whole tail: a character can span tokens
            print(text[len(shown) :], end="", flush=True)
            shown = text
    except ValueError:
        print(flush=True)
        raise
    t_end = time.perf_counter()
    decode_rate = (len(ids) - 1) / (t_end - t_first) if len(ids) > 1 else float("nan")
    print(
        f"\n--- prompt: {prompt.shape[1]} tokens at {prompt.shape[1] / (t_first - t0):,.1f} "
        f"tokens/s; generated: {len(ids)} tokens at {decode_rate:,.1f} tokens/s"
    )


if __name__ == "__main__":
    main()
