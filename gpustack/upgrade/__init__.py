"""Rolling, drain-aware, resumable driver upgrades (issue 6): planner, state, orchestrator."""
