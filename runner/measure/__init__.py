"""What a step costs and what the machine can do: FLOPs, the matmul peak, the step's floor, profiles, the allocator,
and the hooks that measure beside the training loop."""
