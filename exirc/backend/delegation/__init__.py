"""Delegation: parts of a Backend-dialect graph handed to a backend.

A partitioner (`interface.Partitioner`) says which nodes go to which
backend, and why the others do not; the `delegate` pass cuts each partition
out as a `PartitionGraph`, asks the backend to `preprocess` it into a
payload, and replaces it with one delegate call node.
"""
