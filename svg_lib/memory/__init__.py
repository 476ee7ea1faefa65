"""Layer 3, arithmetic only: what a kernel configuration needs of a TPU core's VMEM (`vmem`)
and SMEM (`smem`), known before anything is built or compiled."""
