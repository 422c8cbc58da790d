"""tracing stage."""
