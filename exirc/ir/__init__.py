"""Shared helpers over the compiler's graph IR (torch.fx graphs of every stage).

    control_flow  walking graphs and the subgraphs of cond / map / while_loop
    rewrite       the one driver of local rewrites: a rule per node, every subgraph
    meta          the metadata passes leave on nodes and graphs, with accessors
    source        user source locations and module paths of nodes, for messages
    state         program state: the buffers methods update, and their slots
"""
