"""The local test bed: real Kubernetes, S3 (MinIO), Kafka and Spark as processes on loopback."""
