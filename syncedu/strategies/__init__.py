"""Layer 2, strategies: algorithms written once against `Comm`.

collectives (naive, ring, tree, halving-doubling), dp (gradient sync), ps
(parameter servers), syncbn (SyncBatchNorm), compress (gradient compression).
Each is tested equal to its naive version and to the framework's built-in.
"""
