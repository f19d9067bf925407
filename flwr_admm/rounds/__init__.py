"""The wire-neutral round layer both Flower APIs translate to (`server`, `serverapp`).

What a strategy does around its math, without either API's message types: seeded
sampling (`sampling`), client identity (`identity`), checkpoint files (`checkpoint`),
round metrics and the divergence watchdog's feed (`report`), the round of client-held
duals (`client_duals`) with its server state and arithmetic (`client_duals_state`,
`client_duals_replies`, `client_duals_sweep`), and the peer baselines' rounds
(`peers`, `scaffold`, `feddyn`, `fednova`). It imports the numpy core, the protocol
and Flower's shared type aliases and logger only; the adapters import it, never each
other.
"""
