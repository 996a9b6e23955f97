"""Rolling, drain-aware, resumable driver upgrades: planner, state, orchestrator."""
