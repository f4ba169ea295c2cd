"""What a process held at its peak of allocated memory, and where each block was allocated.

    with PeakRecorder("cuda") as recorder:
        work()
    print(recorder.peak().report())

The profiler's allocation events (torch.profiler, `profile_memory`) are replayed in order; at the
event where a device's allocator held the most, the blocks still allocated are listed, largest
first, with when they were allocated and the Python frames of Kiln's code that allocated them. A
block freed in Python but kept by CUDA IPC until its receiver lets go counts as held, as the
allocator counts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

MIB = 1 << 20
# Frames of libraries, left out of a block's frames (the profiler names a frame by its file
# relative to the import path it came from, as "core/evaluate/trial.py(131): run_trial").
LIBRARY_FRAMES = ("torch/", "triton/", "_pytest/", "pluggy/", "contextlib.py", "threading.py",
                  "functools.py", "selectors.py", "socket.py")


@dataclass
class Block:
    nbytes: int
    at_ms: float  # allocated this long after the recording began
    frames: list[str]


@dataclass
class Peak:
    nbytes: int = 0
    at_ms: float = 0.0
    blocks: list[Block] = field(default_factory=list)

    def report(self, smallest: int = MIB) -> str:
        lines = [f"peak {self.nbytes / MIB:.0f} MiB allocated at {self.at_ms:.0f} ms; blocks "
                 f"of {smallest / MIB:g} MiB or more held then:"]
        shown = [b for b in self.blocks if b.nbytes >= smallest]
        for block in shown:
            lines.append(f"  {block.nbytes / MIB:8.1f} MiB, allocated at {block.at_ms:7.0f} ms: "
                         + " < ".join(block.frames[:6]))
        rest = sum(b.nbytes for b in self.blocks if b.nbytes < smallest)
        lines.append(f"  {rest / MIB:8.1f} MiB in {len(self.blocks) - len(shown)} smaller blocks")
        return "\n".join(lines)


def peak_of(prof: profile, device_type: str) -> Peak:
    """The peak of `device_type`'s allocator in the recording `prof`, and the blocks held then."""
    events: list[tuple[int, int, int, int, list[str]]] = []

    def walk(event: object, chain: list[str]) -> None:
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            if fields.device.type == device_type:
                events.append((event.start_time_ns, fields.ptr, fields.alloc_size,
                               fields.total_allocated, chain))
            return
        name = event.name
        own = event.tag == _EventType.PyCall and not name.startswith(LIBRARY_FRAMES)
        for child in event.children:
            walk(child, chain + [name] if own or event.tag == _EventType.TorchOp else chain)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, [])
    if not events:
        return Peak()
    events.sort(key=lambda e: e[0])
    start = events[0][0]
    top = max(range(len(events)), key=lambda i: events[i][3])
    live: dict[int, Block] = {}
    for when, ptr, size, _, chain in events[:top + 1]:
        if size > 0:
            live[ptr] = Block(size, (when - start) / 1e6, list(reversed(chain)))
        else:
            live.pop(ptr, None)
    blocks = sorted(live.values(), key=lambda b: -b.nbytes)
    return Peak(events[top][3], (events[top][0] - start) / 1e6, blocks)


class PeakRecorder:
    """Records allocations while it is entered; `peak()` after."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                                with_stack=True)

    def __enter__(self) -> PeakRecorder:
        self.profiler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.profiler.__exit__(*exc)

    def peak(self) -> Peak:
        return peak_of(self.profiler, self.device_type)
