"""Fleet views, pure: doctor problems, status and drift, plan summaries, converged hosts."""
