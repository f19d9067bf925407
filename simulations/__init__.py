"""Side-by-side comparisons of FedADMM, FedAvg, FedProx and FedNova as a Flower App.

- ``admm_app``: the Flower App (`flwr run simulations`).
- ``python -m simulations.compare``: run strategies with `flwr run`, plot, summarize.
- ``python -m simulations.diagnose``: seed 003's data and update diagnostics.
"""
