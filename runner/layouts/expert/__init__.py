"""Expert parallelism: a mixture of experts' experts placed n_experts / ep to a rank, over ep
ranks drawn from the data-parallel ones (split.py); tokens dispatched to their experts' ranks and
back by all-to-all, timed and counted (exchange.py) and predicted (traffic.py)."""
