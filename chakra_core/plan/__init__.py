"""chakra-sim plan: the fastest parallel layout of a training job that fits in memory."""
