"""The wire-neutral round layer both Flower APIs translate to (`server`, `serverapp`).

What a strategy does around its math, without either API's message types: the layer
(`layer`: sampling, admission, the report, the watchdog's feed, checkpoints), what a
round exchanges (`exchange`), what the strategies show of it (`views`), client identity
and the seeded draw (`identity`), checkpoint files (`checkpoint`), the keyword checks
(`checks`), server-held FedADMM's round (`fedadmm`), the client-held-dual protocol and
its round (`client_duals`) with its server state and arithmetic (`client_duals_state`,
`client_duals_replies`, `client_duals_sweep`), and the peer baselines' rounds (`peers`,
`scaffold`, `feddyn`, `fednova`). It imports the numpy core, the option values
(`flwr_admm.options`), the uplink's decoders, the protocol and Flower's shared type
aliases and logger only; the adapters import it, never each other.
"""
