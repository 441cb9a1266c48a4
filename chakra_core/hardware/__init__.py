"""Hardware descriptions (profiles) and the NCCL cost model that reads them."""
