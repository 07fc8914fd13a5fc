"""The plan stage: where every planned tensor lives in memory.

`out_variants` makes every op write into memory it is given (an `alloc` node,
see `alloc`); `lifetimes` finds the planned tensors and when each is live;
`memory` places them in one arena and proves the placement sound; `passes`
wraps planning as the `memory_plan` pass.
"""
