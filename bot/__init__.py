"""vllm-oncall: diagnose vLLM start-up crashes on Kubernetes and propose an approvable fix."""

__version__ = "0.1.0"
