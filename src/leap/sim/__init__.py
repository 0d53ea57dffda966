"""The reference fleet simulator: jobs, physical throughput truth (the oracle), scheduler."""
