"""Quantized checkpoints: the directory scripts/quantize.py writes (save_quantized) and
nn.from_pretrained loads (load_quantized) into QuantizedWeights built from the stored codes
and scales, so that no fp32 copy of a quantized weight is ever made.

The layout: a Hugging Face-style directory, config.json + model.safetensors.
- config.json: the fp32 checkpoint's own, plus the entry "quantization": {"format": a
  tinygrad_like/formats.py FORMATS name, "group_size": the elements per scale asked for (null:
  the format's default), "tensors": the names of the quantized weights} (nn/hf.py
  read_quantization checks it).
- model.safetensors: for each quantized weight NAME (the name the fp32 checkpoint gives it),
  NAME.codes and, for a scaled format (all but bf16 / fp16), NAME.scales, in
  tinygrad_like/formats.py's layout: one row per output channel (a GPT-2 Conv1D weight,
  (in, out) in the fp32 file, is stored transposed: N = out), codes (N, K) uint8 for the 8-bit
  formats, (N, K/2) uint8 for the 4-bit ones (element 2j in the low nibble), (N, K) uint16 for
  bf16 / fp16, scales (N, K / group) fp32. An embedding stored padded to an aligned vocabulary
  (nn/config.py) keeps only its vocab_size rows, as the fp32 file does; the loader quantizes
  the zero padding rows again (the codes quantize_model gives them). Every other tensor (norms,
  biases, GPT-2's position table) is as the fp32 checkpoint has it: fp32, the same name.
  Its metadata records the format ({"quantization": FORMAT}), which must agree with config.json.
- the Hugging Face tokenizer files of the fp32 checkpoint's directory, when it has them as
  regular files (a symbolic link is never followed: it could point at any file);
- SHA256SUMS: the sha256 of every other file (`sha256sum -c SHA256SUMS` checks it by hand).
Which weights are quantized is quantize_model's choice (nn/quant.py quantized_modules): the
loader reads the same list, so a loaded model equals the fp32 one quantized on load, code for
code.

The folder is written as training checkpoints are: into a staging folder, swapped in whole
(tinygrad_like/files.py replaced_whole), so a crash or a full disk never leaves codes of one
format under another's config. A load verifies the sums, the format the file records, every
shape and dtype, and every value: fp32 tensors finite, scales finite and positive, no code
that decodes to inf or nan; a save refuses what a load would.
"""

import json
import os

import numpy as np

from tinygrad_like import backend, dtypes, files, formats, quant
from tinygrad_like.files import atomic_write
from tinygrad_like.quant import QuantizedWeight

from . import hf
from .module import Parameter
from .quant import quantized_modules

CODES, SCALES = ".codes", ".scales"  # the suffixes of a quantized weight's two tensors
# Hugging Face's tokenizer files, copied beside the weights when the source directory has them
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "generation_config.json",
)
TOKENIZER_BYTES = 256 << 20  # the most a tokenizer file copied may have (Gemma's is 34 MB)


def quantized_tensors(model):
    """A quantized model's tensors as the file stores them: name -> host array (the layout
    above); and the names of its quantized weights, in order."""
    tensors, names = {}, []
    for name, p in model.named_parameters():
        if isinstance(p, QuantizedWeight):
            names.append(name)
            be = backend.of(p.codes)
            tensors[name + CODES] = be.to_numpy(p.unpadded(p.codes))  # padded rows: out_axis 0
            if p.scales is not None:
                tensors[name + SCALES] = be.to_numpy(p.unpadded(p.scales))
        else:
            tensors[name] = np.asarray(p.unpadded(p.numpy()), dtype=np.float32)
    return {k: np.ascontiguousarray(v) for k, v in tensors.items()}, names


def save_quantized(path, model, source, group_size=None):
    """Write model (quantized by quantize_model with group_size) as a quantized checkpoint at
    path, replacing whatever folder is there whole, with the config.json of the checkpoint
    directory it was loaded from (source) and its tokenizer files -> (the tensors written,
    name -> array; the tokenizer files of source not copied: links, or not regular files).
    A tensor that a load would refuse (check_value) is a ValueError before anything is
    written; an OSError (a full disk) leaves no folder behind and path as it was."""
    from safetensors.numpy import save

    held = {p.fmt for p in model.parameters() if isinstance(p, QuantizedWeight)}
    if len(held) != 1:
        raise ValueError(f"a quantized checkpoint holds one format, the model has {held or 0}")
    fmt = held.pop()
    tensors, names = quantized_tensors(model)
    for name, array in tensors.items():
        check_value(name, array, fmt, "the model cannot be saved")
    _, config = hf.read_json(source)
    config[hf.QUANTIZATION] = {"format": fmt, "group_size": group_size, "tensors": names}
    present = [n for n in TOKENIZER_FILES if os.path.lexists(os.path.join(source, n))]
    with files.replaced_whole(path) as staging:
        weights = save(tensors, metadata={hf.QUANTIZATION: fmt})
        atomic_write(os.path.join(staging, hf.WEIGHTS), weights)
        atomic_write(os.path.join(staging, hf.CONFIG), json.dumps(config, indent=2).encode())
        copied = [
            n
            for n in present
            if files.copy_regular(
                os.path.join(source, n), os.path.join(staging, n), TOKENIZER_BYTES
            )
        ]
        files.write_sums(staging, [hf.WEIGHTS, hf.CONFIG, *copied])
    return tensors, [n for n in present if n not in copied]


def check_value(name, array, fmt, consequence):
    """A ValueError naming the tensor (the file's name for it) when array is not a value a
    weight of format fmt can hold: a scale that is not finite and > 0, a code that decodes to
    inf or nan, an fp32 tensor with inf or nan. consequence: what follows, for the message."""
    if name.endswith(SCALES):
        bad = "a scale that is not finite and > 0"
        ok = np.isfinite(array).all() and (array > 0).all()
    elif name.endswith(CODES):
        bad, finite = f"a code that decodes to inf or nan in {fmt}", _finite_codes(fmt)
        ok = finite is None or finite[array].all()
    else:
        bad, ok = "nan or inf", np.isfinite(array).all()
    if not ok:
        raise ValueError(f"{name} holds {bad}: {consequence}")


def _finite_codes(fmt):
    """A lookup table, code -> whether it decodes to a finite number (one entry per code of
    the format's bits); None when every code does (the integer formats, fp4_e2m1)."""
    f = formats.FORMATS[fmt]
    if f.fields[2] == formats.FINITE:
        return None
    codes = np.arange(2**f.bits, dtype=np.uint16 if f.bits == 16 else np.uint8)
    return np.isfinite(codes.view(f.element).astype(np.float32))


def _verify(path, fmt):
    """Check the quantized checkpoint at path before its tensors are read: every file against
    SHA256SUMS (which must list config.json and model.safetensors), and the format
    model.safetensors records against config.json's."""
    if not os.path.isfile(os.path.join(path, files.SUMS)):
        raise ValueError(
            f"{path} holds {fmt} weights but no {files.SUMS}: nothing proves them whole; "
            "quantize the fp32 checkpoint again (scripts/quantize.py)"
        )
    listed = files.read_sums(path, (hf.WEIGHTS, hf.CONFIG, *TOKENIZER_FILES))
    unlisted = [n for n in (hf.CONFIG, hf.WEIGHTS) if n not in listed]
    if unlisted:
        raise ValueError(
            f"{os.path.join(path, files.SUMS)} has no sum of {' or '.join(unlisted)}: "
            "the folder is damaged; quantize the fp32 checkpoint again"
        )
    files.verify_sums(path, listed, files.SUMS)
    recorded = hf.read_metadata(path).get(hf.QUANTIZATION)
    if recorded != fmt:
        raise ValueError(
            f"{os.path.join(path, hf.WEIGHTS)} records {recorded or 'no'} weights, but "
            f"{hf.CONFIG} says {fmt}: the folder is damaged; quantize the fp32 checkpoint again"
        )


def load_quantized(cls, path, config, dtype=None, device=None, options=None):
    """The cls model (GPT2 or Llama, of config) in the quantized checkpoint at path, on device,
    run with options. It is built on the meta device (shapes only), then each parameter is
    replaced: a quantized weight by a QuantizedWeight over the stored codes and scales, any
    other by its stored fp32 values. dtype: fp32 or None (a quantized model computes in fp32)."""
    entry = hf.read_quantization(path)
    fmt = entry["format"]
    if dtype is not None and dtypes.as_dtype(dtype) != dtypes.float32:
        raise ValueError(
            f"{path} holds {fmt} weights, which compute in fp32: load it with dtype fp32"
        )
    be = backend.get(device or backend.default_device())
    _verify(path, fmt)
    tensors = hf.read_tensors(path, hf.max_weights_bytes(config))
    model = cls(config, device="meta", options=options)
    out_axes = {f"{name}.weight": axis for name, _, axis in quantized_modules(model)}
    params = dict(model.named_parameters())
    scaled = formats.FORMATS[fmt].scaled
    problems = []
    listed, expected = sorted(entry["tensors"]), sorted(n for n in params if n in out_axes)
    if listed != expected:
        problems.append(
            f"config.json's quantization lists {len(listed)} tensors, not the {len(expected)} "
            "weights the model quantizes"
        )
    wanted = {key for name in params for key in _stored_names(name, name in out_axes, scaled)}
    missing, extra = sorted(wanted - set(tensors)), sorted(set(tensors) - wanted)
    if missing:
        problems.append(f"missing tensors: {', '.join(missing[:4])}")
    if extra:
        problems.append(f"unexpected tensors: {', '.join(extra[:4])}")
    loaded = {}  # id(meta parameter) -> its weight, on the host
    for name, p in params.items():
        if problems:
            break
        try:
            if name in out_axes:
                group = entry["group_size"]
                loaded[id(p)] = _quantized(tensors, name, p, fmt, group, out_axes[name])
            else:
                loaded[id(p)] = _plain(tensors[name], name, p)
        except ValueError as e:
            problems.append(str(e))
    file = os.path.join(path, hf.WEIGHTS)
    if problems:
        raise ValueError(
            f"{file} does not match the {hf.family(config)} model "
            f"of its config.json: {'; '.join(problems[:3])}"
        )
    for name, array in tensors.items():  # every dtype is the layout's by now
        check_value(f"{file}: {name}", array, fmt, "the file is corrupt")
    model.replace_parameters(loaded)
    return model.to(device=be.name)


def _quantized(tensors, name, p, fmt, group_size, out_axis):
    """The QuantizedWeight (on the host) for the meta parameter p from name's stored codes and
    scales, checked against the layout group_size gives; padding rows quantized from zeros."""
    N, K = p.shape if out_axis == 0 else p.shape[::-1]
    rows = p.rows or N
    g = formats.check_group_size(fmt, K, group_size)
    (codes_shape, codes_dtype), scales_shape = formats.stored_layout(fmt, rows, K, g)
    codes, scales = tensors[name + CODES], tensors.get(name + SCALES)
    if codes.shape != codes_shape or codes.dtype != codes_dtype:
        raise ValueError(
            f"{name}{CODES}: {codes.dtype} {codes.shape}, expected {codes_dtype} {codes_shape}"
        )
    if scales is not None and (scales.shape != scales_shape or scales.dtype != np.float32):
        raise ValueError(
            f"{name}{SCALES}: {scales.dtype} {scales.shape}, expected float32 {scales_shape}"
        )
    if rows < N:  # the zero rows past the vocabulary, as quantize() codes them
        pad = quant.quantize(np.zeros((N - rows, K), np.float32), fmt, g)
        codes = np.concatenate([codes, pad.codes])
        scales = None if scales is None else np.concatenate([scales, pad.scales])
    return QuantizedWeight(fmt, codes, scales, g, p.shape, out_axis, p.rows)


def _stored_names(name, quantized, scaled):
    """The file's tensors for the parameter name: NAME.codes (and NAME.scales) or NAME."""
    if not quantized:
        return [name]
    return [name + CODES, name + SCALES] if scaled else [name + CODES]


def _plain(array, name, p):
    """The Parameter (on the host) for the meta parameter p from its stored fp32 rows."""
    if tuple(array.shape) != p.unpadded_shape or array.dtype != np.float32:
        raise ValueError(
            f"{name}: {array.dtype} {tuple(array.shape)}, expected float32 {p.unpadded_shape}"
        )
    if p.rows is not None:
        padded = np.zeros(p.shape, np.float32)
        padded[: p.rows] = array
        array = padded
    return Parameter(array, rows=p.rows)
