"""Launch-time ranking: value per unit cost, premium filter, fail-open."""
