"""Every buffer the framework allocates, tagged by what it is for, with its birth and death.

Tags: the persistent training state (weights, gradients, master, adam_m, adam_v), the arrays
the tape saves for backward (activations) and everything else kernels make (temporaries,
tracked only while a trace is recording, since that costs a finalizer per launch), and a
generation's KV cache (nn/lm.py's KVCache, its keys and values for every position). An array no
kernel made (the caller's token ids, which the CPU uses as they are) counts while a record
saves it, and is forgotten after: it is the caller's memory, before and after the step.

A buffer is identified by its root array (views share their base's memory, so a slice of the
QKV output saved three times counts once). A buffer's death is seen through a weakref
finalizer, so the numbers follow the real lifetimes Python gives the arrays.
"""

import gc
import time
import weakref

TAGS = (
    "weights",
    "gradients",
    "master",
    "adam_m",
    "adam_v",
    "activations",
    "temporaries",
    "kv_cache",
)
PERSISTENT = TAGS[:5]


def root(array):
    """The array that owns the memory behind a view."""
    while getattr(array, "base", None) is not None and hasattr(array.base, "nbytes"):
        array = array.base
    return array


def _unique_roots(arrays):
    seen = {}
    for a in arrays:
        if not hasattr(a, "nbytes"):  # a Python scalar saved by Mul or Div: no buffer
            continue
        buf = root(a)
        seen.setdefault(id(buf), buf)
    return seen.values()


class MemoryTracker:
    def __init__(self):
        self.buffers = {}  # id(root) -> [tag, nbytes]
        self.saved_by = {}  # id(root) -> number of live tape records that saved it
        self.adopted = set()  # id(root) of saved buffers no kernel made
        self.current = dict.fromkeys(TAGS, 0)
        self.peak = dict.fromkeys(TAGS, 0)
        self.peak_total = 0
        self.events = None  # list of (seconds, tag, delta bytes) while recording
        self.track_temporaries = False
        self._t0 = 0.0

    # ---- bookkeeping
    def _move(self, tag, delta):
        self.current[tag] += delta
        self.peak[tag] = max(self.peak[tag], self.current[tag])
        self.peak_total = max(self.peak_total, self.total())
        if self.events is not None:
            self.events.append((time.perf_counter() - self._t0, tag, delta))

    def total(self):
        return sum(self.current.values())

    def settled(self):
        """The live bytes per tag once the garbage is collected: a buffer that died in a
        reference cycle is gone from it, so the difference of two readings is what was made
        between them and still lives, whatever earlier work left for the collector."""
        gc.collect()
        return dict(self.current)

    def register(self, array, tag):
        """Start tracking an array's buffer under tag (or move it to tag if tracked)."""
        buf = root(array)
        key = id(buf)
        entry = self.buffers.get(key)
        if entry is not None:
            self.retag(buf, tag)
            return
        try:
            weakref.finalize(buf, self._death, key)
        except TypeError:  # an array type without weakrefs: cannot see its death, skip it
            return
        self.buffers[key] = [tag, buf.nbytes]
        self._move(tag, buf.nbytes)

    def retag(self, array, tag, only_from=None):
        entry = self.buffers.get(id(root(array)))
        if entry is None or entry[0] == tag or (only_from and entry[0] not in only_from):
            return
        self._move(entry[0], -entry[1])
        entry[0] = tag
        self._move(tag, entry[1])

    def tag_of(self, array):
        entry = self.buffers.get(id(root(array)))
        return entry[0] if entry else None

    def _death(self, key):
        entry = self.buffers.pop(key, None)
        if entry is None:  # forgotten (an adopted buffer) before it died
            return
        self.saved_by.pop(key, None)
        self.adopted.discard(key)
        self._move(entry[0], -entry[1])

    # ---- the tape's use: saved arrays are activations while some record holds them
    def save_for_backward(self, arrays):
        """Tag the buffers a record saves; returns the bytes newly counted as activations
        (a buffer already saved by an earlier record, or a weight, adds nothing)."""
        new = 0
        for buf in _unique_roots(arrays):
            if self.tag_of(buf) in PERSISTENT:
                continue
            count = self.saved_by.get(id(buf), 0)
            if count == 0:
                adopt = self.tag_of(buf) is None  # no kernel made it
                self.register(buf, "activations")
                if adopt and self.tag_of(buf) is not None:
                    self.adopted.add(id(buf))
                new += buf.nbytes
            self.saved_by[id(buf)] = count + 1
        return new

    def release_saved(self, arrays):
        """A record freed its saved arrays: buffers no live record holds any more go back to
        being temporaries (if anything else still keeps them alive), or untracked when no
        kernel made them (adopted)."""
        for buf in _unique_roots(arrays):
            count = self.saved_by.get(id(buf))
            if count is None:
                continue
            if count == 1:
                del self.saved_by[id(buf)]
                if id(buf) in self.adopted:  # the caller's again: no longer counted
                    self.adopted.discard(id(buf))
                    tag, nbytes = self.buffers.pop(id(buf))  # its finalizer finds nothing
                    self._move(tag, -nbytes)
                else:
                    self.retag(buf, "temporaries", only_from=("activations",))
            else:
                self.saved_by[id(buf)] = count - 1

    # ---- traces
    def start_recording(self, temporaries=True, t0=None):
        """Record a timeline from now; the current bytes per tag are its starting point.
        t0: the perf_counter() reading event times count from (default now); pass a
        profiler's t0 to put kernels and memory on one clock."""
        self._t0 = time.perf_counter() if t0 is None else t0
        self.events = [(0.0, tag, self.current[tag]) for tag in TAGS]
        self.peak = dict(self.current)
        self.peak_total = self.total()
        self.track_temporaries = temporaries

    def stop_recording(self):
        events, self.events, self.track_temporaries = self.events, None, False
        return events

    def report(self):
        return {tag: {"current": self.current[tag], "peak": self.peak[tag]} for tag in TAGS}


def timeline(events):
    """Recorded events -> (times in seconds, {tag: bytes live at each time}), one point per
    event: the step function a plot or a trace counter draws."""
    live = dict.fromkeys(TAGS, 0)
    times, series = [], {tag: [] for tag in TAGS}
    for t, tag, delta in events:
        live[tag] += delta
        times.append(t)
        for name in TAGS:
            series[name].append(live[name])
    return times, series


def counter_events(events, pid=1, tid=0, name="memory (bytes)"):
    """Chrome trace counter ("C") events: bytes per tag after every birth and death, which
    Perfetto and chrome://tracing draw as one stacked chart."""
    times, series = timeline(events)
    return [
        {
            "name": name,
            "ph": "C",
            "ts": t * 1e6,
            "pid": pid,
            "tid": tid,
            "args": {tag: series[tag][i] for tag in TAGS},
        }
        for i, t in enumerate(times)
    ]


TRACKER = MemoryTracker()
