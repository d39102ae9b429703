"""Tables, verdicts, figures and routing profiles rebuilt from run directories.

CLIs (each reads run directories or folders of them; metrics come from cachesim
and are cached per trace, see analysis.cache):

* ``python -m analysis.tables RUN_DIR ... --format markdown|latex|csv|json [--out DIR]``
* ``python -m analysis.verdict RUN_DIR ...``
* ``python -m analysis.figures RUN_DIR|TRACE_DIR ... --out DIR``
* ``python -m analysis.profile RUN_DIR|TRACE_DIR|TRACE...``

In a notebook, ``analysis.frame.load_runs(paths)`` returns the runs as a pandas
DataFrame (one row per run × domain; columns in :mod:`analysis.frame`).

Entry points for a results page (:mod:`analysis.study`; fractions, NaN where
there is no value, CI bounds from a paired bootstrap over evaluation windows):

* ``frame.load_runs(paths, *, cache_dir=None, jobs=None, skip_broken=False) -> DataFrame``: runs × domains.
* ``study.load_study(root, *, cache_dir=None, jobs=None, skip_broken=False) -> list[Run]``: a study
  root's runs, loaded once for everything below (an unreadable run directory is an error, or, with
  ``skip_broken``, left out and named on stderr).
* ``study.frame(runs) -> DataFrame``: the load_runs frame of loaded runs.
* ``study.delta_ppl_vs_a(runs) -> DataFrame``: per run, ``delta_ppl`` vs arm A
  and ``delta_ppl_ci_low/_high/_note``, ``delta_ppl_seeds_n/_mean/_sd``.
* ``study.miss_reduction_vs_a(runs) -> DataFrame``: the same for the LRU miss
  reduction at 25% of E (``miss_reduction_25...``).
* ``study.comparisons(runs) -> DataFrame``: both of them in one frame.
* ``study.write_training_curves(runs, png)``, ``study.write_hit_vs_budget_a_vs_b(runs,
  png, *, config=None, dense=False)``, ``study.write_usage_heatmaps(runs, png)``,
  ``study.write_dose_response(runs, png)``, ``study.write_trace_usage(trace_dir, png)``:
  one figure each to the given ``.png`` path, which they return.

Analysis never imports training code: the run directory is the contract.
"""
