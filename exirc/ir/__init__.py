"""Shared helpers over the compiler's graph IR (torch.fx graphs of every stage).

    control_flow  walking graphs and the subgraphs of cond / while_loop
    source        user source locations and module paths of nodes, for messages
    state         program state: the buffers methods update, and their slots
"""
