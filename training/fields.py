"""The fields of a file the trainer reads back (trainer_state.json, the run config it holds),
each checked for type and range before any is used: a file is untrusted input, and its sha256
proves only that it is the file that was saved (anyone who edits it can write a new sum).

A rule is (words, test): what the value must be, and a function of the value that says whether
it is. A dict of rules is an object holding at least those keys; Exactly(dict) one holding
exactly those (where every key is used: the loss scaler's, the sums', NumPy's generator
state)."""

import math

from tinygrad_like import dtypes


class Exactly(dict):
    """An object that must hold exactly these keys, each checked by its rule."""


def integer(lo=0, below=None):
    words = f"an integer >= {lo}" + (f" and < {below:#x}" if below else "")
    return words, lambda v: type(v) is int and lo <= v and (below is None or v < below)


def number(lo=0.0, above=True):
    """A finite number above lo (or at least lo); JSON has no int / float distinction."""
    return (
        f"a finite number {'>' if above else '>='} {lo:g}",
        lambda v: type(v) in (int, float) and math.isfinite(v) and (v > lo if above else v >= lo),
    )


def one_of(values):
    return f"one of {', '.join(map(str, values))}", lambda v: type(v) is str and v in values


def optional(rule):
    """rule, or null: a rule (words, test) or an object's rules."""
    return ("null or", rule)


HEX64 = (
    "64 hex digits",
    lambda v: type(v) is str and len(v) == 64 and not set(v) - set("0123456789abcdef"),
)
BOOL = "true or false", lambda v: type(v) is bool
OBJECT = "an object", lambda v: isinstance(v, dict)

# trainer_state.json, as training/loop.py's Trainer.save and checkpoint.save_checkpoint write it
TRAINER_STATE = {
    "step": integer(0),
    "data": {
        "seed": integer(0),
        "batches_drawn": integer(0),
        "batch_size": integer(1),
        "seq_len": integer(1),
    },
    "scaler": optional(
        Exactly(
            scale=number(),
            good_steps=integer(0),
            skipped_steps=integer(0),
            skips_in_a_row=integer(0),
            growth_factor=number(1.0, above=False),
            backoff_factor=number(),
            growth_interval=integer(1),
            dynamic=BOOL,
        )
    ),
    "dropout_rng": Exactly(
        bit_generator=one_of(["PCG64"]),
        state=Exactly(state=integer(0, 2**128), inc=integer(0, 2**128)),
        has_uint32=integer(0, 2),
        uinteger=integer(0, 2**32),
    ),
    "run_config": OBJECT,  # its fields: training/cli.py saved_run, by RunConfig's types
    "dtype": one_of(dtypes.TRAINING),
    "world_size": integer(1),
    "optimizer": {"step": integer(0)},
}


def check(where, value, rule, name=None):
    """ValueError '{where}: {name} must be {words}, got {value}' for the first field of value
    (a JSON object read from the file `where`) that rule does not allow."""
    if isinstance(rule, tuple) and rule[0] == "null or":
        if value is not None:
            check(where, value, rule[1], name)
        return
    if isinstance(rule, dict):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: {name or 'the file'} must be a JSON object")
        keys = set(value)
        for key, sub in rule.items():
            keys.discard(key)
            field = f"{name}.{key}" if name else key
            if key not in value:
                raise ValueError(f"{where}: has no {field}: the file is corrupt or not ours")
            check(where, value[key], sub, field)
        if keys and isinstance(rule, Exactly):
            raise ValueError(f"{where}: {name} holds unknown fields ({', '.join(sorted(keys))})")
        return
    words, test = rule
    if not test(value):
        raise ValueError(f"{where}: {name} must be {words}, got {_short(value)}")


def _short(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
