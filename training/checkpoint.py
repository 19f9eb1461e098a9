"""Training checkpoints that survive a crash at any moment, and the run folder they live in.

<out>/checkpoint/ holds one complete checkpoint:
    config.json, model.safetensors   the fp32 master weights in Hugging Face's GPT-2 format,
                                     so generate.py and transformers load it as is
    optimizer.safetensors            AdamW's m and v per parameter (fp32)
    trainer_state.json               step, optimizer scalars, loss scaler, data position,
                                     RNG state, the run's config and the sha256 of every file
A save writes a whole new directory beside it (every file fsynced), then swaps the two with
renames (tinygrad_like/files.py replaced_whole): checkpoint -> checkpoint.old, new ->
checkpoint, then deletes checkpoint.old. A crash before the swap leaves the previous checkpoint
untouched; a crash between the two renames leaves it as checkpoint.old, which find_checkpoint()
falls back to. Nothing non-finite is ever saved, and a save that fails (a full disk) removes
its half-written directory.

The sha256 sums let a load refuse a corrupted checkpoint instead of training on it: a flipped
byte inside the weights still parses, so only a checksum can tell. trainer_state.json's own sum
covers its other keys (it cannot hold the sum of the text it is part of). Every field of it is
checked for type and range before use (training/fields.py), and only the four files above are
ever opened by a name it holds.
"""

import errno
import fcntl
import hashlib
import json
import os
import shutil

import numpy as np

from nn.hf import CONFIG, WEIGHTS, check_dir, max_weights_bytes, read_config, read_tensors
from tinygrad_like import files
from tinygrad_like.files import atomic_write

from . import fields

STATE, OPTIMIZER = "trainer_state.json", "optimizer.safetensors"
LOCK = ".lock"
SUM_FIELDS = fields.Exactly(dict.fromkeys((CONFIG, WEIGHTS, OPTIMIZER, STATE), fields.HEX64))


class CheckpointError(ValueError):
    """A checkpoint or run folder that cannot be used or written (exit code 2)."""


# ---------------------------------------------------------------- saving


def save_checkpoint(out, model, master, optimizer_state, trainer_state):
    """Write master (AdamW.master_state()) and optimizer_state (AdamW.state_dict()) with
    trainer_state as out/checkpoint, replacing the one there only once all of it is on disk."""
    from safetensors.numpy import save

    final = os.path.join(out, "checkpoint")
    arrays, scalars = optimizer_state
    _check_finite(out, trainer_state["step"], {"weights": master, "AdamW m and v": arrays})
    try:
        with files.replaced_whole(final) as staging:
            model.save_pretrained(staging, state=master)
            atomic_write(os.path.join(staging, OPTIMIZER), save(arrays))
            state = dict(trainer_state, optimizer=scalars)
            state["sha256"] = {
                f: files.file_sha256(os.path.join(staging, f)) for f in (CONFIG, WEIGHTS, OPTIMIZER)
            }
            state["sha256"][STATE] = _state_sha256(state)
            atomic_write(os.path.join(staging, STATE), json.dumps(state, indent=1).encode())
    except OSError as e:
        need = sum(a.nbytes for a in (*master.values(), *arrays.values()))
        raise CheckpointError(_save_failed(out, trainer_state["step"], e, need)) from None
    return final


def _check_finite(out, step, groups):
    """FloatingPointError (the run diverged: exit 1) naming the first non-finite array."""
    for what, group in groups.items():
        for name, array in group.items():
            if not np.isfinite(array).all():
                raise FloatingPointError(
                    f"{what} hold nan or inf at step {step} ({name}): not saved; {on_disk(out)}"
                )


def _save_failed(out, step, e, need):
    what = write_failed(out, e, f"the step-{step} checkpoint", f" needs about {need / 1e6:,.1f} MB")
    return f"{what}; nothing partial is left, {on_disk(out)}"


def write_failed(out, e, what, need=""):
    """The words for OSError e, met writing `what` in the folder out (a run folder, or a
    quantized checkpoint's, which may not exist yet): a full disk says how much is free (need:
    what `what` needed), any other error its reason."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        there = os.path.abspath(out)
        while not os.path.exists(there):  # out itself may not be made yet
            there = os.path.dirname(there)
        free = shutil.disk_usage(there).free
        return f"disk full: {what}{need} in {out} ({free / 1e6:,.1f} MB free)"
    return f"could not write {what} in {out}: {e.strerror or e}"


def on_disk(out):
    """Which checkpoint a stopped run leaves, in words (for its last message)."""
    try:
        ckpt = find_checkpoint(out)
        step = load_trainer_state(ckpt, arrays=False)[0]["step"]
    except (ValueError, OSError):
        return f"no usable checkpoint is in {out}"
    return f"the step-{step} checkpoint in {ckpt} is kept"


# ---------------------------------------------------------------- loading


def find_checkpoint(path):
    """A directory that holds config.json + model.safetensors: path itself, its checkpoint/,
    or (after a save interrupted mid-swap) its checkpoint.old/, or path.old when path was being
    replaced whole (scripts/quantize.py --overwrite)."""
    folder = os.path.normpath(path)
    for candidate in (folder, *(os.path.join(folder, n) for n in ("checkpoint", "checkpoint.old"))):
        if os.path.isfile(os.path.join(candidate, WEIGHTS)):
            return candidate
    if not os.path.exists(folder) and os.path.isfile(os.path.join(folder + ".old", WEIGHTS)):
        return folder + ".old"
    check_dir(path)  # raises with the list of files expected


def load_trainer_state(ckpt, arrays=True):
    """-> (trainer_state dict, optimizer arrays or None), every file's checksum verified;
    or an error naming the file that is missing or corrupt."""
    missing = [f for f in (STATE, OPTIMIZER) if not os.path.isfile(os.path.join(ckpt, f))]
    if missing:
        raise FileNotFoundError(
            f"{ckpt} has model weights but no {' or '.join(missing)}: it can "
            "start a fine-tune (--init-from) but cannot be resumed"
        )
    state = read_trainer_state(ckpt)
    if not arrays:
        return state, None
    verify(ckpt, state)
    path = os.path.join(ckpt, OPTIMIZER)
    try:  # m and v: twice the weights' fp32 bytes at most
        loaded = read_tensors(ckpt, 2 * max_weights_bytes(read_config(ckpt)), OPTIMIZER)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    for name, array in loaded.items():
        if array.dtype != np.float32:
            raise CheckpointError(f"{path}: {name} is {array.dtype}, not float32: not ours")
        if not np.isfinite(array).all():
            raise CheckpointError(f"{path}: {name} holds nan or inf: the file is corrupt")
    return state, loaded


def read_trainer_state(ckpt):
    """trainer_state.json as a dict, every field checked (training/fields.py), or
    CheckpointError naming it (not JSON, wrong sum, a field of the wrong type or range)."""
    path = os.path.join(ckpt, STATE)
    try:
        state = json.loads(files.read_small(path))
        fields.check(path, state, {"sha256": SUM_FIELDS})
        if state["sha256"][STATE] != _state_sha256(state):
            raise ValueError(f"{path}: its content does not match its sha256: the file is corrupt")
        fields.check(path, state, fields.TRAINER_STATE)
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        if isinstance(e, (json.JSONDecodeError, UnicodeDecodeError)):
            e = f"{path}: not valid JSON ({e}); the file is corrupt"
        raise CheckpointError(str(e)) from None
    return state


def verify(ckpt, state=None):
    """Check every file of a training checkpoint against the sha256 its trainer_state.json
    holds (CheckpointError naming the file). A Hugging Face directory has no sums to check."""
    if state is None:
        if not os.path.isfile(os.path.join(ckpt, STATE)):
            return
        state = read_trainer_state(ckpt)
    sums = {name: digest for name, digest in state["sha256"].items() if name != STATE}
    try:
        files.verify_sums(ckpt, sums, STATE)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def _state_sha256(state):
    rest = {k: v for k, v in state.items() if k != "sha256"}
    sums = {k: v for k, v in (state.get("sha256") or {}).items() if k != STATE}
    return hashlib.sha256(json.dumps([rest, sums], sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------- the run folder


def checkpoint_step(out):
    """The step of the run saved in folder out, or None when it holds no checkpoint."""
    for name in ("checkpoint", "checkpoint.old"):
        if os.path.isfile(os.path.join(out, name, WEIGHTS)):
            try:
                return read_trainer_state(os.path.join(out, name))["step"]
            except (CheckpointError, OSError):
                return "?"
    return None


def held_run(out, lock=True):
    """What of an earlier run folder out holds, in words, or None: its checkpoint, or else
    its metrics.jsonl or (lock: when a lock counts) its lock, which a run leaves from its first
    step and first moment on (one stopped before its first save has no checkpoint, and its rows
    are still its own)."""
    step = checkpoint_step(out)
    metrics = os.path.join(out, "metrics.jsonl")
    if step is not None:
        return f"a run at step {step}"
    if os.path.isfile(metrics):
        with open(metrics, "rb") as f:
            return f"a run's metrics.jsonl ({sum(1 for _ in f)} rows, no checkpoint)"
    if lock and os.path.lexists(os.path.join(out, LOCK)):
        return f"a run's {LOCK} (no checkpoint)"
    return None


def held_folder(path):
    """(What the folder path holds in words, whether it is a run folder) when it holds a run
    or a checkpoint (a training checkpoint, a model directory, quantized or not); (None,
    False) when it is missing or empty. A folder that holds anything else is a ValueError:
    replacing it whole (scripts/quantize.py --out) would delete files that are not a model's.
    A folder whose replacing died between its renames is path.old (files.replaced_whole)."""
    path = os.path.normpath(path)
    if not os.path.exists(path) and os.path.isdir(path + ".old"):
        path += ".old"
    names = sorted(os.listdir(path)) if os.path.isdir(path) else []
    run = held_run(path) if names else None
    if run is not None:
        return run, True
    if CONFIG in names or WEIGHTS in names:
        return f"a checkpoint ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})", False
    if names:
        raise ValueError(
            f"--out {path} holds files that are not a model's ({', '.join(names[:3])}"
            f"{', ...' if len(names) > 3 else ''}), which replacing it would delete: name a new "
            "or empty folder"
        )
    return None, False


def claim_run_folder(out, overwrite, resumed_from=None):
    """Lock the run folder out for this run (the returned file holds the lock), then refuse it
    (CheckpointError) when it holds another run, unless overwrite, which deletes that run's
    checkpoints. The lock comes first, the look after: a run that stalled between the two
    would otherwise take a folder that another run locked, trained and saved in meanwhile.
    resumed_from: the checkpoint this run continues, whose folder is its own."""
    lock_found = os.path.lexists(os.path.join(out, LOCK))  # another run's sign, not ours
    lock = lock_run_folder(out)
    try:
        held = held_run(out, lock=lock_found)
        here = os.path.realpath(out)
        ours = resumed_from and here in (
            os.path.realpath(resumed_from),
            os.path.dirname(os.path.realpath(resumed_from)),
        )
        if held is not None and not ours:
            if not overwrite:
                resume = checkpoint_step(out) is not None
                raise CheckpointError(
                    f"{out}/ already holds {held}: "
                    + (f"--resume {out} to continue, or " if resume else "")
                    + "--out elsewhere, or --overwrite"
                )
            for name in ("checkpoint", "checkpoint.old", "checkpoint.new"):
                shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    except BaseException:
        lock.close()
        raise
    return lock


def lock_run_folder(out):
    """Make out (a folder) and hold an exclusive lock on it for as long as the returned file
    stays open: a second run into the same folder gets CheckpointError saying who holds it.
    The kernel drops the lock when the holder dies, even by SIGKILL."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise CheckpointError(f"--out {out} is a file, not a folder: choose another --out")
    try:
        os.makedirs(out, exist_ok=True)
        # never through a link: a .lock that is one is refused (ELOOP), its target untouched
        fd = os.open(os.path.join(out, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        f = os.fdopen(fd, "a+")
    except OSError as e:  # a read-only file system, no permission
        raise CheckpointError(f"{write_failed(out, e, LOCK)}: choose another --out") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise CheckpointError(
            f"{out} is in use by another run ({holder}): wait for it to finish or use another --out"
        ) from None
    try:  # unbuffered, so that a failed write is not tried again when f is closed
        os.ftruncate(f.fileno(), 0)
        os.write(f.fileno(), f"pid {os.getpid()}\n".encode())
    except OSError as e:
        f.close()
        raise CheckpointError(f"{write_failed(out, e, LOCK)}: choose another --out") from None
    return f
