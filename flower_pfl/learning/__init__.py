"""What one client's learning needs: models, data and partitions, local training loops,
parameter vectors, devices and per-client metrics. No Flower import: the in-process engine,
the Flower clients and the benchmark scripts share it."""
