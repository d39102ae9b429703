"""Cache-aware routing at inference: the model and its expert caches run together (SPEC §7).

* ``reroute``   the training-free routing rules (tolerance τ, Cache-Prior,
                Max-Rank, second-expert elision, domain priming), each a pure
                function of the router output and the cache state, served by
                ``cachesim.online.cache_token_step`` (the simulator's one rule).
* ``coupled``   the cache-coupled evaluation: the model's own forward pass with
                a routing override (``MoETransformer.__call__(route_fn=...)``),
                so perplexity is measured with the experts actually used.
* ``frontier``  the rerouting frontier of trained runs, written as
                ``frontier.json`` into each run directory
                (``python -m moe.cache_aware.frontier``).

This is model-side code that *uses* the simulator: ``cachesim`` itself never
imports the model.
"""
