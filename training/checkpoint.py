"""Training checkpoints that survive a crash at any moment.

<out>/checkpoint/ holds one complete checkpoint:
    config.json, model.safetensors   the fp32 master weights in Hugging Face's GPT-2 format,
                                     so generate.py and transformers load it as is
    optimizer.safetensors            AdamW's m and v per parameter (fp32)
    trainer_state.json               step, optimizer scalars, loss scaler, data position,
                                     RNG state and the run's config
A save writes a whole new directory beside it (every file fsynced), then swaps the two with
renames: checkpoint -> checkpoint.old, new -> checkpoint, then deletes checkpoint.old. A crash
before the swap leaves the previous checkpoint untouched; a crash between the two renames
leaves it as checkpoint.old, which find_checkpoint() falls back to.
"""
import json
import os
import shutil

from nn.hf import WEIGHTS, check_dir
from tinygrad_like.files import atomic_write, fsync_dir

STATE, OPTIMIZER = "trainer_state.json", "optimizer.safetensors"


def save_checkpoint(out, model, optimizer, trainer_state):
    from safetensors.numpy import save
    final = os.path.join(out, "checkpoint")
    staging = os.path.join(out, "checkpoint.new")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, state=optimizer.master_state())
    arrays, scalars = optimizer.state_dict()
    atomic_write(os.path.join(staging, OPTIMIZER), save(arrays))
    state = dict(trainer_state, optimizer=scalars)
    atomic_write(os.path.join(staging, STATE), json.dumps(state, indent=1).encode())
    old = os.path.join(out, "checkpoint.old")
    if not os.path.isdir(final) and os.path.isdir(old):
        os.rename(old, final)  # an earlier save died mid-swap: its old checkpoint is the one
    shutil.rmtree(old, ignore_errors=True)
    if os.path.isdir(final):
        os.rename(final, old)
    os.rename(staging, final)
    fsync_dir(out)
    shutil.rmtree(old, ignore_errors=True)
    return final


def find_checkpoint(path):
    """A directory that holds config.json + model.safetensors: path itself, its checkpoint/,
    or (after a save interrupted mid-swap) its checkpoint.old/."""
    for candidate in (path, os.path.join(path, "checkpoint"), os.path.join(path, "checkpoint.old")):
        if os.path.isfile(os.path.join(candidate, WEIGHTS)):
            return candidate
    check_dir(path)  # raises with the list of files expected


def load_trainer_state(ckpt):
    """-> (trainer_state dict, optimizer arrays), or an error saying what is missing."""
    from safetensors.numpy import load_file
    missing = [f for f in (STATE, OPTIMIZER) if not os.path.isfile(os.path.join(ckpt, f))]
    if missing:
        raise FileNotFoundError(f"{ckpt} has model weights but no {' or '.join(missing)}: it can "
                                "start a fine-tune (--init-from) but cannot be resumed")
    with open(os.path.join(ckpt, STATE)) as f:
        state = json.load(f)
    return state, load_file(os.path.join(ckpt, OPTIMIZER))
