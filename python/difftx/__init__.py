"""difftx: Differential Transformer layers with hand-derived backward passes.

difftx.torch holds the PyTorch ops and modules (import difftx.torch);
difftx.transformers puts them into transformers' DiffLlama models.
"""

__version__ = "0.1.0"
