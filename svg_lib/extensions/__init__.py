"""Beside the lesson, above `attention`: what the layers and instruments build on but the lesson's
floors do not need. `radial` (Radial Attention's static mask) and `sliding` (3-D sliding tiles,
notebook 10, on `tile_layout`'s cubes) are masks; `device_plan` (the planner in jnp, inside
`jax.jit`) and `observed` (hooks on the block-sparse forward: tile masses, skip-softmax) serve the
semantic and next-plan layers; `bounded_max` replays the forward's bound test for its pass rate;
`token_order` moves q, k, v into a temporal head's token order and back, and `stacked_schedules`
stacks several masks' schedules into one table (both for the routed layer).
What only the tests, notebooks and checkers read: `tolerances` (the series' tolerances, per dtype), `smem_forms`
(what each form of the schedule would take in SMEM), `references` (attention and its gradients in
float64 on the host), `top_level_vmem` (the XLA option a bare Splash kernel could take instead)."""
