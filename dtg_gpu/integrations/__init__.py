"""Integrations with the frameworks users run their sweeps in. Each imports its framework
lazily, only when used: `dtg_gpu.integrations.optuna` (extra `dtg_gpu[optuna]`) and
`dtg_gpu.integrations.ray_tune` (extra `dtg_gpu[ray]`)."""
