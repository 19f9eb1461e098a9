"""The host timer the CPU and meta backends time launches with (CUDA's are CUDA events with the
same .stop() and .seconds())."""

import time


class HostTimer:
    def __init__(self):
        self.t0 = time.perf_counter()
        self.t1 = None

    def stop(self):
        self.t1 = time.perf_counter()
        return self

    def seconds(self):
        return self.t1 - self.t0
