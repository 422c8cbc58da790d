"""outcomes stage."""
