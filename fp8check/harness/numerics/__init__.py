"""Engine numerics as pure functions over tensors, below the engines and the checks (docs/design.md, layers):
the post-load transforms an engine may declare (`transforms`), the activation quantizers of each engine's FP8
GEMMs and the reference forward of the embedded models (`forward`). Engines declare which kinds they run; checks
look the kinds up here and never import engine code."""
from .transforms import TRANSFORMS, apply_post_load, requant_ue8m0

__all__ = ["TRANSFORMS", "apply_post_load", "requant_ue8m0"]
