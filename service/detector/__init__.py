"""detector stage: sequential regression detection per signal, agent and version."""
