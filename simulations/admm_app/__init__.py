"""The Flower App of flwr-admm's simulations: one ServerApp, one ClientApp, any strategy.

Modules import each other relatively so the package works both from the repository
(``simulations.admm_app``) and from an installed Flower App bundle (``admm_app``).
"""
