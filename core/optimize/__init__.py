"""Optimize: the run that ties the stages together, from a MODEL spec to an installed model.

The command line (`cli`), the run itself (`run`: profile, baselines, the search across sites,
the store), the end-to-end check of the installed winners (`e2e`) and the reports.
"""
