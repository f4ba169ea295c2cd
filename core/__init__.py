"""Kiln's pipeline, one sub-package a stage, imports running downward only.

    runtime   what an installed model or exported package needs (capture, sites, install)
    timing    how Kiln measures (timer, L2 flush and rotation, the device lock)
    profile   MODEL spec -> ranked sites with roofline floors and site problems
    evaluate  (site problem, candidate) -> verdict, in isolated workers
    search    a tree of candidates per site (the generators sit between evaluate and search)
    optimize  the run, the end-to-end check and the reports; `python -m core.optimize`
"""
