"""Llama against Hugging Face's LlamaForCausalLM (skipped without PyTorch and transformers): the
same random weights, written by our save_pretrained and read by transformers' from_pretrained
(which also proves the format), give the same logits, loss, every parameter's gradient and
greedy generation, with and without grouped-query attention, both models in fp64.

Run with a Python that has torch and transformers, e.g.
    PYTHONPATH=. /path/to/torch-venv/bin/python -m pytest -q tests/test_llama_hf_parity.py
"""

import math

import numpy as np
import pytest

from nn import ExecutionOptions, Llama, LlamaConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIGS = {
    "mha": LlamaConfig(2, 32, 4, 4, 48, 101, 32, rms_norm_eps=1e-6),
    "gqa": LlamaConfig(2, 32, 4, 2, 48, 101, 32, rms_norm_eps=1e-6),  # 2 query heads per K/V
    "mqa": LlamaConfig(1, 48, 6, 1, 40, 70, 24, rope_theta=500.0),  # one K/V head
}
OPTIONS = {
    "flash, fused head": ExecutionOptions(),
    "naive, plain head": ExecutionOptions(attention="naive", lm_head="plain"),
}


def randomized(cfg, options, seed=0):
    """Our Llama with weights far from the 0.02 init (well-apart logits: greedy choices that
    do not hinge on rounding), in fp64."""
    model = Llama(cfg, options=options)
    rng = np.random.default_rng(seed)
    state = {}
    for name, p in model.named_parameters():
        shape = p.unpadded_shape
        if name.endswith("norm.weight"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            a = rng.standard_normal(shape)
        else:  # (out, in)
            a = rng.standard_normal(shape) / math.sqrt(shape[1])
        state[name] = a.astype(np.float32)
    model.load_state_dict(state)
    return model


def pair(tmp_path, cfg, options):
    """(ours in fp64, LlamaForCausalLM in fp64) with the same weights, through the files."""
    ours = randomized(cfg, options)
    ours.save_pretrained(tmp_path)
    theirs = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path, torch_dtype=torch.float64, attn_implementation="eager"
    ).eval()
    return ours.to("fp64"), theirs


def batch(cfg, B=2, T=None, seed=1):
    rng = np.random.default_rng(seed)
    T = T or cfg.max_position_embeddings
    x = rng.integers(0, cfg.vocab_size, (B, T))
    y = rng.integers(0, cfg.vocab_size, (B, T))
    y[0, :3] = -1  # ignored targets
    return x, y


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
def test_logits_loss_and_every_gradient_match(tmp_path, cfg, options):
    ours, theirs = pair(tmp_path, cfg, options)
    x, y = batch(cfg)
    ref_logits = theirs(torch.from_numpy(x)).logits  # (B, T, V)
    # our targets are already each position's next token: no shift, unlike labels=
    ref_loss = torch.nn.functional.cross_entropy(
        ref_logits.reshape(-1, cfg.vocab_size), torch.from_numpy(y.reshape(-1)), ignore_index=-1
    )
    ref_loss.backward()

    logits, _ = ours(x)  # the plain head, for the logits
    np.testing.assert_allclose(logits.numpy(), ref_logits.detach().numpy(), rtol=1e-6, atol=1e-6)
    ours.zero_grad()
    _, loss = ours(x, y)
    loss.backward()
    np.testing.assert_allclose(loss.numpy(), ref_loss.item(), rtol=1e-7)
    theirs_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        ref = theirs_params[name].grad.numpy()
        np.testing.assert_allclose(
            p.unpadded(p.grad.numpy()), ref, rtol=1e-5, atol=1e-8, err_msg=name
        )
    assert set(theirs_params) == {name for name, _ in ours.named_parameters()}


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
def test_greedy_generation_matches(tmp_path, cfg):
    ours, theirs = pair(tmp_path, cfg, ExecutionOptions())
    prompt, _ = batch(cfg, T=5)
    new = cfg.max_position_embeddings - 5
    got = ours.generate(prompt, new, temperature=0)
    ref = theirs.generate(
        torch.from_numpy(prompt),
        attention_mask=torch.ones(prompt.shape, dtype=torch.long),
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        pad_token_id=0,
    )
    np.testing.assert_array_equal(got, ref.numpy())


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_directory_transformers_wrote_loads_with_its_logits(tmp_path, tied):
    """LlamaForCausalLM's own save_pretrained (a tied model writes no lm_head.weight) read by
    nn.from_pretrained, which picks the family from config.json."""
    import nn

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=90,
        max_position_embeddings=16,
        tie_word_embeddings=tied,
        initializer_range=0.2,
    )
    theirs = transformers.LlamaForCausalLM(config).eval()
    theirs.save_pretrained(tmp_path)
    ours = nn.from_pretrained(tmp_path, dtype="fp64")
    assert isinstance(ours, Llama) and ours.config.num_key_value_heads == 2
    x, _ = batch(ours.config, T=16)
    with torch.no_grad():
        ref = theirs.double()(torch.from_numpy(x)).logits.numpy()
    np.testing.assert_allclose(ours(x)[0].numpy(), ref, rtol=1e-6, atol=1e-6)
