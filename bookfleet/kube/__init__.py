"""The Kubernetes side: custom resource models, generated CRDs, manifest builders and (elsewhere) the kopf operator."""
