"""The interpreter core: load a program, check it, bind each instruction, run the loops.

Nothing here imports an optional engine: the core asks `exirc.runtime.engines`
(the seam) whether one takes a method or a delegate, and runs the reference
path itself otherwise.
"""
