"""`sluice bench`: the common workload of issue 15 against Sluice and its peers (NATS JetStream, RabbitMQ,
Redis streams, ActiveMQ) in one run, plus the scripts in benchmarks/, with a JSON result, a Markdown report and
PNG plots. See docs/bench.md.

Modules: ``workload`` (what is sent and which filters drain it), ``procs`` (starting and stopping a server by
pid), ``sluice_runner`` (Sluice through the SDK), ``peer_nats`` / ``peer_rabbitmq`` / ``peer_redis`` /
``peer_activemq`` (one peer each), ``scripts`` (benchmarks/*.py), ``scale`` (the scale table), ``machine``,
``report`` and ``plots`` (output), ``command`` (the click command).
"""
