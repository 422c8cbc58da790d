"""compare stage: quality signals per agent version with intervals, and version comparison."""
