"""quickstart_admm: FedADMM in Flower's PyTorch quickstart (a Flower App)."""
