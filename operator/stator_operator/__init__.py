"""The Stator Kubernetes operator (kopf): runs StatefulPipeline resources."""

__version__ = "0.1.0"
