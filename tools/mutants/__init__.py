"""The runtime mutation suite: mutants of real programs, each run in its own process.

The parts, in the order a campaign uses them:

    models, bases          the real programs mutants are made from
    catalog                real operators to swap in
    value_mutations, memory_mutations, instruction_mutations,
    data_mutations, xnnpack_mutations, byte_mutations
                           the mutation kinds, each registered by name (context)
    generate               which mutants to make, and making one from its spec
    warm, server           the fork server, started with what mutants import
    child, runner          what each mutant's process does, and running
                           thousands of them with a CPU budget and a memory limit
    crash_site             which instruction a crashed mutant crashed in
    input_files            bent .npz inputs for `exirc run --inputs`
    session                bases, catalog and warm list, ready for a run
    cli_sample             a sample through the real `exirc` command
    report                 figures, failures grouped by cause, reproducers

`tests/runtime/core/test_mutation_suite.py` runs 2,000 mutants in `make test`;
`tools/mutation_campaign.py` (`make fuzz`) runs the long campaign and
replays one mutant by its label.
"""
