"""The exporter's defaults, written once (light: the CLI reads them to build --help)."""

# The exporter's own port. The Prometheus port-allocation page's exporter range (9100-9999) is
# fully allocated, so any port in it is some other exporter's; 10405 is outside it, below the
# kernel's ephemeral range (32768+) and clear of the Kubernetes node ports (10248-10259).
DEFAULT_PORT = 10405
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
# A 15 s scrape needs no fresher gauges, and NVML's utilisation buffer holds ~14 s, so polling
# every 5 s loses no GPU detail while costing less than half of the UI's 2 s.
DEFAULT_INTERVAL = 5.0
# --attach all samples at most this many processes: one per GPU of a full 8-GPU node.
DEFAULT_MAX_ATTACH = 8
# The most --max-attach takes: each attached process costs about 1.5 % of a core and up to ~25
# series, so 256 is four cores and a few thousand series; a larger number is a typo, not a plan.
MAX_MAX_ATTACH = 256
# The advisor's window (analysis.DEFAULT_WINDOW_S), repeated so --help needs no analysis import;
# a test keeps the two equal.
DEFAULT_WINDOW_S = 60.0
