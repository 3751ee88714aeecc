"""Framework glue, laid out as in TVM (``rivet.contrib.dlpack``)."""
