"""What several benchmark drivers share: statistics, tables, fleets, capacity, cost model."""
