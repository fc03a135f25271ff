"""A Prometheus endpoint over a live session: the same sources, store and advisor as the UI.

``prometheus_client`` is imported only in this package. The collector reads the store when a
scrape comes (nothing is computed between scrapes), so an idle exporter costs what its sources
cost; see ``collector`` for the series and ``account`` for how the GPU-time counters stay
monotonic while the advisor's window slides.
"""
