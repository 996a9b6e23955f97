"""The Kubernetes side: manifests from templates/; cluster/ is the only kubernetes user."""
