"""A spike: FedAvg and FedAMP on Flower's Message API beside the legacy path.

``server_app`` (``flwr.serverapp.strategy.Strategy`` subclasses driven by ``start()``,
and a ``ServerApp``), ``client_app`` (a ``ClientApp`` with ``@app.query`` / ``@app.train``
/ ``@app.evaluate``), ``records`` (the ArrayRecord / ConfigRecord / MetricRecord layout
both halves share) and ``inprocess`` (an in-process ``Grid`` for tests and the
benchmark).  The paper's logic and the clients' training are the legacy path's, called,
not copied; docs/design.md ("Message API spike") has the results and what a full port
takes.  Nothing here is imported by the legacy path.
"""
