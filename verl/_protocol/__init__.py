"""The parts of :mod:`verl.protocol`, one responsibility per module.

Import from ``verl.protocol``; these modules are its implementation and may move.

* ``config`` -- ``DataProtoConfig`` (process-wide auto padding switch);
* ``containers`` -- equality / union / merge of the dicts, TensorDicts and object arrays a DataProto holds;
* ``serialization`` -- how a DataProto's tensors are pickled and written to disk;
* ``padding`` -- pad / unpad to a divisor, fold / unfold the batch dimension;
* ``collate`` -- building a batch from samples, and all-gathering one across ranks;
* ``future`` -- ``DataProtoFuture``, the lazy result of a non-blocking worker-group call.
"""
