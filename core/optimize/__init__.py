"""Optimize: the run that ties the stages together, from a MODEL spec to an installed model.

The command line (`cli`), the run's settings and how a resume rebuilds them (`config`), the
run itself (`run`: profile, baselines, the search across sites, the store; `site_run`: one
searched site; `interrupt`: Ctrl-C), the end-to-end check of the installed winners (`e2e`)
and the reports.
"""
