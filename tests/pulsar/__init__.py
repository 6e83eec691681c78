"""Apache Pulsar's broker keeping its topics on a bookfleet fleet (`make pulsar-demo`, test_pulsar_broker.py)."""
