"""The pass contract and the pipeline that runs passes (shared by all stages)."""
