"""`python -m gpu_runtime serve ...`: see gpu_runtime.cli."""

import os
import sys

# Weights in transparent huge pages (PyTorch's CPU allocator madvises allocations of 2 MB and more when this is set;
# it reads the variable once, so before torch is imported). A batch-1 decode step streams every weight once; on one
# thread over SmolLM2's shapes (thread CPU time, load average ~5) the GEMVs ran 21.3 ms with huge pages against
# 26.9 ms without, a copy of the same bytes 33.1 against 36.5 ms (fewer TLB misses is the likely cause, not
# measured). bench/bench_real_model.py runs the engine and its copy bound alike. THP_MEM_ALLOC_ENABLE=0 keeps 4 KB.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from gpu_runtime.cli import main  # after the allocator's setting

sys.exit(main())
