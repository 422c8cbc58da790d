"""Store stage: durable, idempotent writes of conversations, findings, outcomes and dead letters."""
