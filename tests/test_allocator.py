"""keep_freed_memory: after it, the pages of a batch's freed activations serve the next batch's (no page
faults), as in a demo or an evaluation; each case in a fresh process, the setting being process-wide."""

import subprocess
import sys

import pytest

# batch after batch allocates a forward's activations, then frees them all; blocks of 40-64 MiB, above
# the 32 MiB that glibc's default ever serves from its heap. Prints whether memory is kept and the page
# faults of the last four batches
PROGRAM = """
import resource, sys, torch
from yolox_fast.utils.allocator import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "kept" else False
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    held = [torch.empty(n * 2**18).fill_(1.0) for n in (48, 40, 64, 40)]
    del held
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(kept, sum(faults[-4:]))
"""


def last_batches_faults(side: str) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, side], capture_output=True, text=True, timeout=120, check=True
    )
    kept, faults = done.stdout.split()
    return kept, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_kept_memory_serves_the_next_batch_without_page_faults():
    kept, kept_faults = last_batches_faults("kept")
    default, default_faults = last_batches_faults("default")
    assert (kept, default) == ("True", "False")
    pages = 4 * (48 + 40 + 64 + 40) * 2**20 // 4096  # four batches' 4 KiB pages
    # glibc's default maps each block anew and unmaps it on free: every page faulted in, every batch
    assert default_faults >= 0.95 * pages, (default_faults, pages)
    # kept, the first batches' pages serve the later ones: no fault in most runs, one 64 MiB block's worth of
    # faults (16,384) in about 2 of 5, where a block landed past the heap's top
    assert kept_faults < default_faults / 4, (kept_faults, default_faults)
