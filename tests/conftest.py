"""Test-session set-up shared by every module.

Without a GPU, generated Triton kernels run under Triton's interpreter, which must be chosen
before any kernel (or helper function) is defined. Modules that run kernels set it at import,
but a module collected earlier may already have imported mugraph's Triton helpers; setting it
here, before any test module is imported, makes a subset of the suite behave as the whole
suite does whatever the order.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
