"""Keeping ledgers fully replicated: under-replication state, the auditor, repair planning and Spark jobs.

The domain core shared by the standalone fleet and the Kubernetes operator.
"""
