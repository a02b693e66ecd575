"""TEST HARNESS package: the real-Kubernetes e2e (`make k8s-e2e`, issue 20)."""
