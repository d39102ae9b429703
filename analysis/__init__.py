"""Tables, verdicts, figures and routing profiles rebuilt from run directories.

CLIs (each reads run directories or folders of them; metrics come from cachesim
and are cached per trace, see analysis.cache):

* ``python -m analysis.tables RUN_DIR ... --format markdown|latex|csv|json [--out DIR]``
* ``python -m analysis.verdict RUN_DIR ...``
* ``python -m analysis.figures RUN_DIR|TRACE_DIR ... --out DIR``
* ``python -m analysis.profile TRACE_DIR``

Analysis never imports training code: the run directory is the contract.
"""
