"""The node (client) half of every protocol, written once and wire-neutral.

Config dicts and lists of numpy arrays in, a `Reply` (arrays, metrics, the state to
keep) out; the front ends translate Flower's wire onto it: `flwr_admm.client`
(legacy ``NumPyClient``), `flwr_admm.clientapp` (Message-API handlers) and
`flwr_admm.torch` (a user's PyTorch loop, both APIs).

- `step`: one FedADMM round (prox or linearized form, server- or client-held duals);
- `duals`: the client-held-dual round (acknowledgement, resync, restore, fast ADMM,
  Delta_i with uplink compression, the rebuild share);
- `peers`: SCAFFOLD's and FedDyn's rounds;
- `start`: where the local solve starts (``local_init``);
- `blocks`: the second block a round sends next to the model;
- `records`: what a node keeps in ``context.state``;
- `config`, `reply`: reading the config, the reply value.
"""
