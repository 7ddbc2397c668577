"""A user project: SkyRL 0.4.0's serialized FP8 weight sync (SkyRL's own functions, from its wheel) under fp8check's
pytest plugin (entry point `pytest11`, installed with fp8check). The sync module sits beside its tests."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

# the tiny models' tensors gain nothing from intra-op threads; on a busy 2-core machine OpenMP's spinning threads
# make the run many times slower (the verl example measured 170 s against 7 s)
torch.set_num_threads(1)
