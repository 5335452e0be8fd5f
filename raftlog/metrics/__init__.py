"""The Prometheus endpoint: one registry per node, Kafka's metric names in Prometheus style.

instruments.py holds what the hot paths update (counters and histograms with pre-bound
label children); health.py and collectors.py read state that already exists at scrape time
(one computation, shared with status views); endpoint.py serves GET /metrics on trio;
node.py wires it all to a running Node. docs/operations.md ("Metrics") maps each name to
Kafka's and says what to alert on.
"""
