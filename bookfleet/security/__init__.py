"""Security of the fleet: certificates, TLS contexts, roles on the bookie protocol, ZooKeeper credentials."""
