"""libCacheSim as a second engine: the classic cache policies cachesim does not implement.

`cachesim.policies.external` names the policies (importable without libCacheSim);
`oracle_general` writes libCacheSim's binary trace format; `engine` runs
specs through the `libcachesim` binding — an optional extra,
``pip install 'cacheable-moe[cache-policies]'`` — in a worker process, so that
libCacheSim's aborts on configurations it rejects become one-line errors.
This package's `__init__` imports nothing.
"""
