"""tagma's worker side, in each GPU/CPU worker: the KV write path reads range descriptors.

Mirrors ``vllm.v1.worker``:

* :mod:`tagma.worker.install`: ``install``/``uninstall`` of the whole worker write path, one entry per model
  runner;
* :mod:`tagma.worker.block_table_v1`: Model Runner V1, a ``BlockTable`` whose slot mapping comes from ranges;
* :mod:`tagma.worker.block_tables_v2`: Model Runner V2, the same for ``vllm.v1.worker.gpu``'s ``BlockTables``;
* :mod:`tagma.worker.write_path_counter`: how often the range write path ran (V1 and V2);
* :mod:`tagma.worker.range_rows`: per-request range descriptors as flat arrays, mirrored on the device;
* :mod:`tagma.worker.triton_slot_mapping`: the Triton kernel that turns range descriptors into slots.
"""
