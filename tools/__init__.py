"""Developer tools: fetch helm/kubectl/hadolint, keep the Helm chart in sync with the operator."""
