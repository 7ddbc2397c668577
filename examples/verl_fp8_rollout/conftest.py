"""A user project: verl 0.9.1's FP8 rollout sync (verl's own functions, from the installed package) under
fp8check's pytest plugin (entry point `pytest11`, installed with fp8check). The sync module sits beside its
tests."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

# The tiny models' tensors gain nothing from intra-op threads, and on a busy 2-core machine OpenMP's spinning
# threads made this run 20x slower (measured: 170 s against 7 s with one thread).
torch.set_num_threads(1)
