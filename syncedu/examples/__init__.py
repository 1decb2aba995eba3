"""Worker scripts that run unchanged under `torchrun` (and from the notebooks)."""
